"""How a :class:`~streamjobs.testing.LocalCluster` comes up: six nodes on free ports,
joined with native ``CLUSTER`` commands, until clients see every replica.

Facts this relies on (Redis 7.0):

* `--repl-diskless-sync-delay 0` saves about 6 s of bring-up (the default waits
  5 s for more replicas before a full sync).
* A primary reports `cluster_state:ok` only about 2 s after it started
  (`CLUSTER_WRITABLE_DELAY`), which is the floor of the start-up time.
* `CLUSTER SLOTS` leaves out replicas whose replication offset is still 0, so a
  fresh cluster shows no replicas to clients until each primary took a write.
* A restarted node keeps its `nodes.conf` and rejoins with its old identity; an
  old primary that was failed over comes back as a replica of its successor.
"""

from __future__ import annotations

import random
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, Protocol

import redis
from redis.crc import key_slot

from ._cluster_errors import SLOT_COUNT, ClusterError, ClusterStartupError
from ._process import HOST
from ._server import RedisServer

NODE_COUNT: Final = 6
PRIMARY_COUNT: Final = 3

# The cluster bus listens on port + 10000. Client ports are drawn from a range whose
# bus ports stay below the kernel's usual ephemeral range (32768+), so an outgoing
# connection cannot grab a bus port between our probe and the node's bind. The
# range also keeps clear of 6379-6400, where other Redis servers tend to live.
_BUS_PORT_OFFSET: Final = 10000
_PORT_RANGE: Final = (11000, 22700)

# On top of RedisServer's own arguments (127.0.0.1, foreground, no persistence).
_NODE_ARGS: Final = (
    "--cluster-enabled",
    "yes",
    "--cluster-config-file",
    "nodes.conf",
    "--repl-diskless-sync-delay",
    "0",
)


def _slot_ranges() -> list[tuple[int, int]]:
    """The three primaries' slot ranges, split like `redis-cli --cluster create`."""
    per = SLOT_COUNT / PRIMARY_COUNT
    bounds = [round(per * i) for i in range(PRIMARY_COUNT + 1)]
    return [(bounds[i], bounds[i + 1] - 1) for i in range(PRIMARY_COUNT)]


def _key_in_slots(first: int, last: int) -> str:
    """A key whose hash slot lies in `[first, last]`."""
    for i in range(1_000_000):
        key = f"localcluster:probe:{i}"
        if first <= key_slot(key.encode()) <= last:
            return key
    raise ClusterError(f"no probe key found for slots {first}-{last}")  # pragma: no cover


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def _pick_ports(count: int, exclude: set[int]) -> list[int]:
    """`count` free ports whose bus ports (+10000) are free too."""
    rng = random.SystemRandom()  # independent of any seeding a test does
    ports: list[int] = []
    for _ in range(2000):
        port = rng.randrange(*_PORT_RANGE)
        taken = set(ports) | exclude
        if {port, port + _BUS_PORT_OFFSET} & (taken | {p + _BUS_PORT_OFFSET for p in taken}):
            continue
        if _port_is_free(port) and _port_is_free(port + _BUS_PORT_OFFSET):
            ports.append(port)
            if len(ports) == count:
                return ports
    raise ClusterStartupError(f"could not find {count} free port pairs in {_PORT_RANGE}")


class Bringing(Protocol):
    """What of a ``LocalCluster`` its bring-up uses."""

    _base_dir: Path | None
    _node_timeout_ms: int
    _extra_args: tuple[str, ...]
    _node_extra_args: dict[int, tuple[str, ...]]
    _nodes: dict[int, RedisServer]

    def _cmd(self, port: int, *args: str | int) -> Any: ...
    def _wait(self, deadline: float, what: str, why_not: Callable[[], str | None]) -> None: ...
    def _why_links_down(self) -> str | None: ...
    def _why_not_up(self) -> str | None: ...
    def _why_replicas_hidden(self) -> str | None: ...
    def primaries(self) -> list[int]: ...
    def slot_owners(self, port: int | None = None) -> list[tuple[int, int]]: ...


def bring_up(
    cluster: Bringing, server: str, attempt: int, avoid: set[int], deadline: float
) -> dict[str, float]:
    """Start six nodes on free ports (none in ``avoid``) and make them a usable
    cluster by ``deadline``; return the seconds each phase took.

    Raises:
        PortInUseError: a node's port was taken after it was probed.
    """
    assert cluster._base_dir is not None
    t0 = time.monotonic()
    ports = _pick_ports(NODE_COUNT, avoid)
    for index, port in enumerate(ports):
        node = RedisServer(
            port=port,
            directory=cluster._base_dir / f"try{attempt}-node{index}-{port}",
            binary=server,
            extra_args=[
                *_NODE_ARGS,
                "--cluster-node-timeout",
                str(cluster._node_timeout_ms),
                *cluster._extra_args,
                *cluster._node_extra_args.get(index, ()),
            ],
        )
        cluster._nodes[port] = node
        node.start(wait=False)  # all six boot at once; wait for them below
    for port in ports:
        cluster._nodes[port].wait_ready(max(0.0, deadline - time.monotonic()))
    t1 = time.monotonic()
    _create_native(cluster, ports, deadline)
    cluster._wait(deadline, "replica links up", cluster._why_links_down)
    _bump_replication_offsets(cluster, ports[:PRIMARY_COUNT])
    t2 = time.monotonic()
    cluster._wait(deadline, "cluster_state:ok and replica links up", cluster._why_not_up)
    t3 = time.monotonic()
    _make_replicas_visible(cluster, deadline)
    t4 = time.monotonic()
    return {
        "spawn": t1 - t0,
        "create": t2 - t1,  # slots, meet, replicate, links up
        "converge": t3 - t2,  # cluster_state:ok everywhere
        "replicas_visible": t4 - t3,
    }


def _create_native(cluster: Bringing, ports: list[int], deadline: float) -> None:
    """Create the cluster with `CLUSTER` commands (no `redis-cli`, no sleeps).

    1. Each primary takes its slot range, and every node gets a distinct config
       epoch while it still knows only itself (as `redis-cli` does), so no
       epoch collision has to be resolved later.
    2. Every node meets every other one: no waiting for gossip to spread
       the membership.
    3. Once a replica knows its primary's node id, it replicates it.
    """
    primaries, replicas = ports[:PRIMARY_COUNT], ports[PRIMARY_COUNT:]
    for port, (first, last) in zip(primaries, _slot_ranges(), strict=True):
        cluster._cmd(port, "CLUSTER", "ADDSLOTSRANGE", first, last)
    for epoch, port in enumerate(ports, start=1):
        cluster._cmd(port, "CLUSTER", "SET-CONFIG-EPOCH", epoch)
    for i, port in enumerate(ports):
        for other in ports[i + 1 :]:
            cluster._cmd(port, "CLUSTER", "MEET", HOST, other)
    ids = {port: str(cluster._cmd(port, "CLUSTER", "MYID")) for port in ports}
    pending = dict(zip(replicas, primaries, strict=True))

    def replicate() -> str | None:
        for replica, primary in list(pending.items()):
            try:
                cluster._cmd(replica, "CLUSTER", "REPLICATE", ids[primary])
            except redis.ResponseError as exc:  # "Unknown node": no handshake yet
                return f"{replica} cannot replicate {primary} yet: {exc}"
            del pending[replica]
        return None

    cluster._wait(deadline, "replicas attached", replicate)


def _bump_replication_offsets(cluster: Bringing, primaries: list[int]) -> None:
    """Put one command into each primary's replication stream, right away.

    Redis 7.0 leaves replicas with replication offset 0 out of `CLUSTER SLOTS`,
    so clients (and `target_nodes=ALL_NODES`) would not see them until the
    first write or the 10 s replication ping. Each node learns a replica's
    offset only from that replica's own cluster-bus pings, roughly once a
    second per peer, so a write made once the cluster is ok costs up to ~1 s
    more. Key writes are refused until then (CLUSTERDOWN), but a keyless
    write is not: `FUNCTION FLUSH` on the empty function library is
    replicated and moves the offset. Done now, the pings carry the new offset
    during the ~2 s a fresh primary waits before it reports ok anyway
    (measured: bring-up 2.95 s -> 2.05 s).
    """
    for port in primaries:
        cluster._cmd(port, "FUNCTION", "FLUSH")


def _make_replicas_visible(cluster: Bringing, deadline: float) -> None:
    """Write and delete one key per primary, then wait until every node's
    `CLUSTER SLOTS` lists a replica for every slot range.

    After `_bump_replication_offsets` the wait normally ends at once; the key
    write keeps this step correct on its own.
    """
    for port in cluster.primaries():
        for first, last in cluster.slot_owners(port):
            key = _key_in_slots(first, last)
            cluster._cmd(port, "SET", key, "1")
            cluster._cmd(port, "DEL", key)
    cluster._wait(deadline, "CLUSTER SLOTS lists replicas", cluster._why_replicas_hidden)
