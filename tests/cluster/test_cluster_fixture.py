"""Tests of the cluster fixtures themselves (`streamjobs.testing.LocalCluster`, `plugin.py`).

The destructive tests print what they measured (start-up, failover); run with `-s`
to see it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis as AsyncRedis
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot
from redis.exceptions import MovedError

from streamjobs.testing import ClusterStartupError, LocalCluster
from tests.harness.cluster import ClusterEndpoint
from tests.harness.processes import child_pids, pid_alive


def _require_local(cluster: ClusterEndpoint) -> LocalCluster:
    if not isinstance(cluster, LocalCluster):
        pytest.skip("needs a cluster this session started (not STREAMJOBS_TEST_CLUSTER_URL)")
    return cluster


def test_shared_cluster_has_three_primaries_each_with_a_replica(
    redis_cluster: ClusterEndpoint,
) -> None:
    cluster = _require_local(redis_cluster)
    print(
        f"\ncluster start-up {cluster.startup_seconds:.2f} s "
        + " ".join(f"{k}={v:.2f}" for k, v in cluster.startup_phases.items())
    )
    assert len(cluster.ports) == 6
    assert len(cluster.pids) == 6
    for port in cluster.ports:
        assert cluster.cluster_info(port)["cluster_state"] == "ok"
    primaries, replicas = cluster.primaries(), cluster.replicas()
    assert len(primaries) == 3
    assert len(replicas) == 3
    assert sorted(primaries + replicas) == sorted(cluster.ports)
    # Each primary has its own replica, and together they own every slot.
    assert sorted(cluster.replica_of(p) for p in primaries) == sorted(replicas)
    owned = [r for p in primaries for r in cluster.slot_owners(p)]
    assert sum(last - first + 1 for first, last in owned) == 16384
    assert cluster.url.startswith("redis://127.0.0.1:")
    cluster.wait_settled(timeout_s=1.0)


@pytest.mark.anyio
async def test_cluster_client_writes_to_every_primary_and_sees_replicas(
    redis_cluster: ClusterEndpoint, cluster_client: RedisCluster, uid: str
) -> None:
    # CLUSTER SLOTS as the server states it: {(first, last): {"primary": (host, port), ...}}.
    slots: dict[tuple[int, int], dict[str, Any]] = await cluster_client.execute_command(
        "CLUSTER SLOTS"
    )
    primaries = {tuple(info["primary"]) for info in slots.values()}
    assert len(primaries) == 3
    assert {(n.host, n.port) for n in cluster_client.get_primaries()} == primaries
    # A fresh 7.0 cluster hides replicas until each primary took a write; the
    # fixture must have taken care of that.
    replicas = cluster_client.get_replicas()
    assert replicas
    if isinstance(redis_cluster, LocalCluster):
        assert sorted(n.port for n in replicas) == sorted(redis_cluster.replicas())

    keys: dict[str, tuple[str, int]] = {}
    for (first, last), info in slots.items():
        key = next(
            k for i in range(100_000) if first <= key_slot((k := f"{uid}:{i}").encode()) <= last
        )
        keys[key] = tuple(info["primary"])
        assert await cluster_client.set(key, b"v") is True
    assert set(keys.values()) == primaries

    # Ask each primary directly: the key is there, and every other primary redirects.
    for key, owner in keys.items():
        for host, port in primaries:
            async with AsyncRedis(host=host, port=port) as node:
                if (host, port) == owner:
                    assert await node.get(key) == b"v"
                else:
                    with pytest.raises(MovedError) as moved:
                        await node.get(key)
                    assert moved.value.node_addr == owner


@pytest.mark.faults
def test_sigkill_of_a_primary_promotes_its_replica(fresh_cluster: LocalCluster) -> None:
    cluster = fresh_cluster
    victim = cluster.primaries()[0]
    heir = cluster.replica_of(victim)
    victim_pid = cluster.node_pid(victim)

    started = time.monotonic()
    cluster.kill_node(victim)
    assert not pid_alive(victim_pid)
    promoted_s = cluster.wait_role(heir, "master", timeout_s=30)
    cluster.wait_settled(timeout_s=30)
    settled_s = time.monotonic() - started
    print(f"\nSIGKILL failover: promoted after {promoted_s:.2f} s, settled after {settled_s:.2f} s")

    assert heir in cluster.primaries()
    assert len(cluster.primaries()) == 3
    assert victim not in cluster.live_ports()
    # Failover needs node-timeout (2 s) for the failure report plus election time.
    assert promoted_s > 1.0

    started = time.monotonic()
    cluster.restart_node(victim)
    print(f"restart: old primary rejoined as replica in {time.monotonic() - started:.2f} s")
    assert cluster.role(victim) == "slave"
    assert cluster.replica_of(heir) == victim
    assert cluster.node_pid(victim) != victim_pid
    cluster.wait_settled(timeout_s=10)
    assert len(cluster.replicas()) == 3


@pytest.mark.faults
def test_graceful_failover_flips_roles(fresh_cluster: LocalCluster) -> None:
    cluster = fresh_cluster
    primary = cluster.primaries()[1]
    replica = cluster.replica_of(primary)
    before = set(cluster.primaries())

    seconds = cluster.graceful_failover(replica)
    print(f"\ngraceful failover: settled after {seconds:.3f} s")

    assert cluster.role(replica) == "master"
    assert cluster.role(primary) == "slave"
    assert cluster.replica_of(replica) == primary
    assert set(cluster.primaries()) == (before - {primary}) | {replica}
    assert len(cluster.replicas()) == 3


@pytest.mark.faults
def test_stop_leaves_no_process_and_no_files(fresh_cluster: LocalCluster) -> None:
    cluster = fresh_cluster
    pids = cluster.pids
    assert len(pids) == 6
    directories = [Path(f"/proc/{pid}/cwd").resolve() for pid in pids]
    assert all(d.is_dir() for d in directories)

    started = time.monotonic()
    cluster.stop()
    cluster.stop()  # idempotent
    deadline = time.monotonic() + 5
    while (alive := [pid for pid in pids if pid_alive(pid)]) and time.monotonic() < deadline:
        time.sleep(0.01)
    print(f"\nstop: all nodes gone after {time.monotonic() - started:.2f} s")
    assert alive == []
    assert cluster.pids == []
    assert not any(d.exists() for d in directories)


@pytest.mark.usefixtures("require_cluster_binaries")
def test_failed_start_stops_what_it_started_and_shows_logs() -> None:
    before = child_pids()
    cluster = LocalCluster(node_extra_args={5: ["--no-such-directive", "1"]})
    with pytest.raises(ClusterStartupError, match="no-such-directive") as info:
        cluster.start()
    assert "Bad directive" in str(info.value)  # the failing node's log tail
    assert cluster.pids == []
    assert child_pids() <= before
