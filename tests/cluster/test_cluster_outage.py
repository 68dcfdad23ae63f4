"""A full cluster outage: every node down for 10 s, then back from its AOF.

During the outage every command fails, with redis-py errors of several kinds
(connection refused, and RedisClusterException, which is not a RedisError, once no
node is left to ask). The consumer must ride it out and carry on afterwards.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import anyio
import anyio.to_thread
import pytest
from redis.asyncio.cluster import ClusterNode, RedisCluster

from streamjobs import ClusterMode, ConsumerConfig, Producer, RecoveryConfig
from streamjobs._keys import Keys
from streamjobs.testing import LocalCluster
from tests.harness.cluster import close_cluster_client
from tests.integration._helpers import Recorder, eventually

pytestmark = [pytest.mark.anyio, pytest.mark.faults]

OUTAGE_S = 10.0
AOF = {"extra_args": ["--appendonly", "yes", "--appendfsync", "always"]}


@pytest.fixture
async def client(fresh_cluster: LocalCluster) -> AsyncIterator[RedisCluster]:
    rc = RedisCluster(
        startup_nodes=[ClusterNode(h, p) for h, p in fresh_cluster.startup_nodes],
        socket_connect_timeout=1,
        socket_timeout=2,
    )
    await rc.initialize()
    yield rc
    await close_cluster_client(rc)


def outage(cluster: LocalCluster) -> None:
    ports = cluster.live_ports()
    for port in ports:
        cluster.kill_node(port)
    time.sleep(OUTAGE_S)  # the outage itself: nothing to poll for
    for port in ports:
        cluster.node(port).start(wait=False)
    for port in ports:
        cluster.node(port).wait_ready(30)
    cluster.wait_settled(60)


@pytest.mark.parametrize("fresh_cluster", [AOF], indirect=True)
async def test_a_consumer_rides_out_a_full_cluster_outage(
    fresh_cluster: LocalCluster, client: RedisCluster, service: str, uid: str
) -> None:
    streams = [f"d:{uid}:{i}" for i in range(3)]
    producer = Producer(client, service=service)
    for s in streams:
        await producer.add_stream(s)
        for i in range(5):
            await producer.append(s, {"n": f"a{i}"})
    c = Recorder(
        client,
        service=service,
        cluster_mode=ClusterMode.OSS,
        # Locks outlive the outage, so the streams stay ours through it.
        config=ConsumerConfig(lock_ttl_s=30, read_block_ms=100),
        recovery=RecoveryConfig(min_idle_s=45, interval_s=2, topology_check_interval_s=0.5),
    )
    async with c:

        async def first_part() -> bool:
            return len(c.handled) == 15

        await eventually(first_part)
        await anyio.to_thread.run_sync(outage, fresh_cluster)

        async def appended_after() -> None:
            for s in streams:
                for i in range(5):
                    await producer.append(s, {"n": f"b{i}"})
                await producer.close_stream(s)

        with anyio.fail_after(60):
            while True:  # the client may need a moment to find the cluster again
                try:
                    await appended_after()
                    break
                except Exception:
                    await anyio.sleep(0.5)

        async def all_ended() -> bool:
            return set(c.ended) == set(streams)

        await eventually(all_ended, timeout_s=60)
    handled = [(s, n) for _, s, _, n in c.handled]
    for s in streams:
        assert [n for st, n in handled if st == s] == [f"a{i}" for i in range(5)] + [
            f"b{i}" for i in range(5)
        ]
    keys = Keys(service)
    for s in streams:
        assert await client.exists(keys.lock(s)) == 0
    assert (await client.xpending(keys.assignments, service))["pending"] == 0
