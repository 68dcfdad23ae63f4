"""A real, local OSS Redis Cluster for tests: 3 primaries + 3 replicas.

`LocalCluster` runs six nodes, each a `RedisServer` (a foreground child of the
calling process with its own directory and log), and joins them into a cluster.
Everything is synchronous and polls with deadlines; from async code, call the slow
methods through `anyio.to_thread.run_sync`.

Like the rest of `streamjobs.testing` it uses none of the consumer code: the
cluster is the ground truth that cluster tests are checked against. Its queries
and waits are in `_cluster_view.py`.

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

import atexit
import random
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final, Self

import redis
from redis.crc import key_slot

from ._cluster_view import SLOT_COUNT, ClusterError, ClusterStartupError, ClusterView
from ._process import HOST, PortInUseError, RedisServerError, server_binary
from ._server import RedisServer

NODE_COUNT: Final = 6
PRIMARY_COUNT: Final = 3

# The cluster bus listens on port + 10000. Client ports are drawn from a range whose
# bus ports stay below the kernel's usual ephemeral range (32768+), so an outgoing
# connection cannot grab a bus port between our probe and the node's bind. The
# range also keeps clear of 6379-6400, where other Redis servers tend to live.
_BUS_PORT_OFFSET: Final = 10000
_PORT_RANGE: Final = (11000, 22700)
_START_ATTEMPTS: Final = 3
_LOG_TAIL_LINES: Final = 25

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


class LocalCluster(ClusterView):
    """Six `RedisServer` nodes forming a 3 + 3 OSS cluster.

    Construction does no I/O; `start()` (or `with LocalCluster() as c:`) does.
    Node ports are fixed for the cluster's life; roles are not (`primaries()` and
    `replicas()` ask the running nodes). Killed nodes keep their port and directory
    and can be started again with `restart_node()`; `node(port)` gives the
    `RedisServer` itself (to pause it, read its log, ...).

    Args:
        node_timeout_ms: `cluster-node-timeout`; failover after a crash takes
            about this plus 1.5-2 s.
        extra_args: more `redis-server` arguments for every node,
            e.g. `("--notify-keyspace-events", "Kx")`.
        node_extra_args: more arguments per node index 0-5 (0-2 start as the
            primaries, 3-5 as the replicas); appended after `extra_args`.
        startup_timeout_s: deadline for the whole bring-up.
        redis_server: the server executable; by default `redis-server`, else
            `valkey-server`, else the bundled Valkey. (`redis-cli` is not needed: the
            cluster is created with native `CLUSTER` commands, which measured
            faster than `redis-cli --cluster create` and its 1 s sleeps.)
    """

    def __init__(
        self,
        *,
        node_timeout_ms: int = 2000,
        extra_args: Sequence[str] = (),
        node_extra_args: Mapping[int, Sequence[str]] | None = None,
        startup_timeout_s: float = 30.0,
        redis_server: str | None = None,
    ) -> None:
        self._node_timeout_ms = node_timeout_ms
        self._extra_args = tuple(extra_args)
        self._node_extra_args = {i: tuple(a) for i, a in (node_extra_args or {}).items()}
        self._startup_timeout_s = startup_timeout_s
        self._redis_server = redis_server
        self._base_dir: Path | None = None
        self._nodes: dict[int, RedisServer] = {}
        self._clients: dict[int, redis.Redis] = {}
        self._startup_seconds: float | None = None
        self._phases: dict[str, float] = {}
        self._stopped = False

    # -- life cycle

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> Self:
        """Start the six nodes and create the cluster; return when it is usable.

        Usable means: every node reports `cluster_state:ok`, every replica has
        `master_link_status:up`, and every node's `CLUSTER SLOTS` lists a replica
        for every slot range.

        Raises:
            ClusterStartupError: with the nodes' log tails; everything that was
                started has been stopped again.
        """
        if self._nodes or self._stopped:
            raise ClusterError("a LocalCluster can be started only once")
        server = server_binary(self._redis_server)
        if server is None:
            raise ClusterStartupError(
                f"{self._redis_server or 'redis-server (or valkey-server)'} not found"
            )
        started = time.monotonic()
        deadline = started + self._startup_timeout_s
        self._base_dir = Path(tempfile.mkdtemp(prefix="streamjobs-cluster-"))
        atexit.register(self.stop)  # last resort if the test process exits early
        # A node whose port or bus port (+10000) was taken after we probed it exits
        # with PortInUseError: then all six move to new ports.
        avoid: set[int] = set()
        for attempt in range(1, _START_ATTEMPTS + 1):
            try:
                self._bring_up(server, attempt, avoid, deadline)
                break
            except PortInUseError:
                avoid |= set(self._nodes)
                self._discard_nodes()
                if attempt == _START_ATTEMPTS:
                    self.stop()
                    raise ClusterStartupError(
                        "ports were taken by others in every attempt"
                    ) from None
            except BaseException as exc:
                report = self._failure_report(exc)
                self.stop()
                if isinstance(exc, Exception):
                    raise ClusterStartupError(report) from exc
                raise
        self._startup_seconds = time.monotonic() - started
        return self

    def stop(self) -> None:
        """Stop every node by pid, then remove the temporary directories.

        SIGTERM first (nodes exit within milliseconds), SIGKILL for stragglers.
        Idempotent, and safe after a failed or partial start.
        """
        self._stopped = True
        atexit.unregister(self.stop)
        self._discard_nodes()
        if self._base_dir is not None:
            shutil.rmtree(self._base_dir, ignore_errors=True)
            self._base_dir = None

    def _discard_nodes(self) -> None:
        # Signal all six first, so they shut down in parallel (each within
        # milliseconds); SIGCONT too, in case a test paused one.
        for node in self._nodes.values():
            node.signal(signal.SIGTERM)
            node.resume()
        deadline = time.monotonic() + 5.0
        for port, node in self._nodes.items():
            self._close_client(port)
            node.stop(timeout_s=max(0.0, deadline - time.monotonic()))
        self._nodes = {}

    # -- bring-up

    def _bring_up(self, server: str, attempt: int, avoid: set[int], deadline: float) -> None:
        assert self._base_dir is not None
        t0 = time.monotonic()
        ports = _pick_ports(NODE_COUNT, avoid)
        for index, port in enumerate(ports):
            node = RedisServer(
                port=port,
                directory=self._base_dir / f"try{attempt}-node{index}-{port}",
                binary=server,
                extra_args=[
                    *_NODE_ARGS,
                    "--cluster-node-timeout",
                    str(self._node_timeout_ms),
                    *self._extra_args,
                    *self._node_extra_args.get(index, ()),
                ],
            )
            self._nodes[port] = node
            node.start(wait=False)  # all six boot at once; wait for them below
        for port in ports:
            self._nodes[port].wait_ready(max(0.0, deadline - time.monotonic()))
        t1 = time.monotonic()
        self._create_native(ports, deadline)
        self._wait(deadline, "replica links up", self._why_links_down)
        self._bump_replication_offsets(ports[:PRIMARY_COUNT])
        t2 = time.monotonic()
        self._wait(deadline, "cluster_state:ok and replica links up", self._why_not_up)
        t3 = time.monotonic()
        self._make_replicas_visible(deadline)
        t4 = time.monotonic()
        self._phases = {
            "spawn": t1 - t0,
            "create": t2 - t1,  # slots, meet, replicate, links up
            "converge": t3 - t2,  # cluster_state:ok everywhere
            "replicas_visible": t4 - t3,
        }

    def _create_native(self, ports: list[int], deadline: float) -> None:
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
            self._cmd(port, "CLUSTER", "ADDSLOTSRANGE", first, last)
        for epoch, port in enumerate(ports, start=1):
            self._cmd(port, "CLUSTER", "SET-CONFIG-EPOCH", epoch)
        for i, port in enumerate(ports):
            for other in ports[i + 1 :]:
                self._cmd(port, "CLUSTER", "MEET", HOST, other)
        ids = {port: str(self._cmd(port, "CLUSTER", "MYID")) for port in ports}
        pending = dict(zip(replicas, primaries, strict=True))

        def replicate() -> str | None:
            for replica, primary in list(pending.items()):
                try:
                    self._cmd(replica, "CLUSTER", "REPLICATE", ids[primary])
                except redis.ResponseError as exc:  # "Unknown node": no handshake yet
                    return f"{replica} cannot replicate {primary} yet: {exc}"
                del pending[replica]
            return None

        self._wait(deadline, "replicas attached", replicate)

    def _bump_replication_offsets(self, primaries: list[int]) -> None:
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
            self._cmd(port, "FUNCTION", "FLUSH")

    def _make_replicas_visible(self, deadline: float) -> None:
        """Write and delete one key per primary, then wait until every node's
        `CLUSTER SLOTS` lists a replica for every slot range.

        After `_bump_replication_offsets` the wait normally ends at once; the key
        write keeps this step correct on its own.
        """
        for port in self.primaries():
            for first, last in self.slot_owners(port):
                key = _key_in_slots(first, last)
                self._cmd(port, "SET", key, "1")
                self._cmd(port, "DEL", key)
        self._wait(deadline, "CLUSTER SLOTS lists replicas", self._why_replicas_hidden)

    def _failure_report(self, exc: BaseException) -> str:
        parts = [f"local Redis Cluster failed to start: {exc!r}", f"phases: {self._phases}"]
        for port, node in self._nodes.items():
            state = "running" if node.running else f"exited ({node.returncode})"
            parts.append(f"--- node {port} [{state}]\n{node.log_tail(_LOG_TAIL_LINES)}")
        return "\n".join(parts)

    # -- queries

    @property
    def startup_seconds(self) -> float:
        """Wall time `start()` took, from picking ports to a usable cluster."""
        if self._startup_seconds is None:
            raise ClusterError("the cluster has not been started")
        return self._startup_seconds

    @property
    def startup_phases(self) -> dict[str, float]:
        """Seconds per start-up phase: spawn, create, converge, replicas_visible."""
        return dict(self._phases)

    # -- faults

    def kill_node(self, port: int) -> None:
        """SIGKILL the node on `port` and reap it. Its directory is kept."""
        node = self.node(port)
        if not node.running:
            raise ClusterError(f"node {port} is not running")
        node.kill()
        self._close_client(port)

    def restart_node(self, port: int, timeout_s: float = 30.0) -> None:
        """Start a killed node again on the same port and directory.

        It keeps its `nodes.conf` identity: a primary that was failed over comes
        back as a replica of its successor. Returns once the node reports
        `cluster_state:ok` and, if it is a replica, `master_link_status:up`.
        """
        node = self.node(port)
        if node.running:
            raise ClusterError(f"node {port} is still running")
        deadline = time.monotonic() + timeout_s
        try:
            node.start(wait=False)
            node.wait_ready(timeout_s)
        except RedisServerError as exc:
            raise ClusterError(f"node {port} did not come back: {exc}") from exc

        def why_not() -> str | None:
            if self.cluster_info(port).get("cluster_state") != "ok":
                return f"node {port} is not cluster_state:ok"
            return self._why_link_down(port)

        self._wait(deadline, f"restarted node {port} to rejoin", why_not)

    def graceful_failover(self, replica_port: int, timeout_s: float = 30.0) -> float:
        """`CLUSTER FAILOVER` on a replica; return the seconds until it settled.

        Waits until the replica reports role master, its old primary reports
        being its replica with the link up, and `wait_settled()` holds.
        """
        reply = self._role_reply(replica_port)
        if reply[0] != "slave":
            raise ClusterError(f"node {replica_port} is not a replica")
        old_primary = int(reply[2])
        deadline = time.monotonic() + timeout_s
        started = time.monotonic()
        self._cmd(replica_port, "CLUSTER", "FAILOVER")

        def why_not() -> str | None:
            if self.role(replica_port) != "master":
                return f"node {replica_port} is not master yet"
            if self.node(old_primary).running:
                old = self._role_reply(old_primary)
                if old[0] != "slave" or int(old[2]) != replica_port:
                    return f"old primary {old_primary} does not replicate {replica_port} yet"
                return self._why_link_down(old_primary)
            return None

        self._wait(deadline, f"graceful failover to {replica_port}", why_not)
        self.wait_settled(max(0.0, deadline - time.monotonic()))
        return time.monotonic() - started
