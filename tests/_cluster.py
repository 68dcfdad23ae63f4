"""A real, local OSS Redis Cluster for tests: 3 primaries + 3 replicas.

`LocalCluster` runs six `redis-server` processes as *foreground* children of the
test process (never daemonized: a daemon is re-parented to PID 1, which may reap it
seconds late, so `kill -0` checks lie), each in its own temporary directory, and
joins them into a cluster. Everything is synchronous and polls with deadlines;
from async code, call the slow methods through `anyio.to_thread.run_sync`.

This module must not import `streamjobs`: it is the ground truth the package's
cluster tests are checked against.

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
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Protocol, Self
from urllib.parse import urlsplit

import redis
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.retry import Retry

__all__ = (
    "HOST",
    "ClusterEndpoint",
    "ClusterError",
    "ClusterStartupError",
    "ExternalCluster",
    "LocalCluster",
    "binaries_available",
)

HOST: Final = "127.0.0.1"
SLOT_COUNT: Final = 16384
NODE_COUNT: Final = 6
PRIMARY_COUNT: Final = 3

# The cluster bus listens on port + 10000. Client ports are drawn from a range whose
# bus ports stay below the kernel's usual ephemeral range (32768+), so an outgoing
# connection cannot grab a bus port between our probe and the node's bind. The
# range also keeps clear of 6379-6400, where other Redis servers tend to live.
_BUS_PORT_OFFSET: Final = 10000
_PORT_RANGE: Final = (11000, 22700)
_START_ATTEMPTS: Final = 3
_POLL_INTERVAL_S: Final = 0.02
_LOG_TAIL_LINES: Final = 25

_BASE_ARGS: Final = (
    "--bind",
    HOST,
    "--daemonize",
    "no",
    "--cluster-enabled",
    "yes",
    "--cluster-config-file",
    "nodes.conf",
    "--repl-diskless-sync-delay",
    "0",
    "--save",
    "",
    "--appendonly",
    "no",
)


class ClusterError(RuntimeError):
    """The local cluster did not reach or keep the state a test asked for."""


class ClusterStartupError(ClusterError):
    """The cluster could not be started; the message carries the nodes' log tails."""


class _PortTakenError(ClusterError):
    """A node could not bind its port: someone took it after we probed. Retry."""


class ClusterEndpoint(Protocol):
    """What every cluster fixture offers: where to connect."""

    @property
    def url(self) -> str: ...

    @property
    def startup_nodes(self) -> list[tuple[str, int]]: ...


@dataclass(frozen=True, kw_only=True)
class ExternalCluster:
    """A cluster someone else runs (`STREAMJOBS_TEST_CLUSTER_URL`); never modified."""

    url: str

    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        parts = urlsplit(self.url)
        return [(parts.hostname or HOST, parts.port or 6379)]


def binaries_available(redis_server: str = "redis-server", redis_cli: str = "redis-cli") -> bool:
    """Whether both executables are on PATH (or are existing paths)."""
    return shutil.which(redis_server) is not None and shutil.which(redis_cli) is not None


@dataclass(kw_only=True)
class _Node:
    port: int
    directory: Path
    args: list[str]
    proc: subprocess.Popen[bytes] | None = None
    client: redis.Redis | None = field(default=None, repr=False)

    @property
    def log_path(self) -> Path:
        return self.directory / "redis.log"

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError as exc:
            return f"<no log: {exc}>"
        return "\n".join(text.splitlines()[-lines:])


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


def _parse_info(text: str) -> dict[str, str]:
    info: dict[str, str] = {}
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if sep:
            info[name.strip()] = value.strip()
    return info


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


class LocalCluster:
    """Six foreground `redis-server` children forming a 3 + 3 OSS cluster.

    Construction does no I/O; `start()` (or `with LocalCluster() as c:`) does.
    Node ports are fixed for the cluster's life; roles are not (`primaries()` and
    `replicas()` ask the running nodes). Killed nodes keep their port and directory
    and can be started again with `restart_node()`.

    Args:
        node_timeout_ms: `cluster-node-timeout`; failover after a crash takes
            about this plus 1.5-2 s.
        extra_args: more `redis-server` arguments for every node,
            e.g. `("--notify-keyspace-events", "Kx")`.
        node_extra_args: more arguments per node index 0-5 (0-2 start as the
            primaries, 3-5 as the replicas); appended after `extra_args`.
        startup_timeout_s: deadline for the whole bring-up.
        redis_server: the server executable. (`redis-cli` is not needed: the
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
        redis_server: str = "redis-server",
    ) -> None:
        self._node_timeout_ms = node_timeout_ms
        self._extra_args = tuple(extra_args)
        self._node_extra_args = {i: tuple(a) for i, a in (node_extra_args or {}).items()}
        self._startup_timeout_s = startup_timeout_s
        self._redis_server = redis_server
        self._base_dir: Path | None = None
        self._nodes: dict[int, _Node] = {}
        self._startup_seconds: float | None = None
        self._phases: dict[str, float] = {}
        self._stopped = False

    # ------------------------------------------------------------------ life cycle

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
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
        server = shutil.which(self._redis_server)
        if server is None:
            raise ClusterStartupError(f"{self._redis_server!r} not found on PATH")
        started = time.monotonic()
        deadline = started + self._startup_timeout_s
        self._base_dir = Path(tempfile.mkdtemp(prefix="streamjobs-cluster-"))
        atexit.register(self.stop)  # last resort if the test process exits early
        avoid: set[int] = set()
        for attempt in range(1, _START_ATTEMPTS + 1):
            try:
                self._bring_up(server, attempt, avoid, deadline)
                break
            except _PortTakenError:
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
        nodes = list(self._nodes.values())
        for node in nodes:
            if node.running():
                assert node.proc is not None
                node.proc.terminate()
                # A test may have SIGSTOPped the node; a stopped process would only
                # act on SIGTERM once continued.
                node.proc.send_signal(signal.SIGCONT)
        deadline = time.monotonic() + 5.0
        for node in nodes:
            self._close_client(node)
            if node.proc is None:
                continue
            try:
                node.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                node.proc.kill()
                node.proc.wait()
        for node in nodes:
            shutil.rmtree(node.directory, ignore_errors=True)
        self._nodes = {}

    # ------------------------------------------------------------------ bring-up

    def _bring_up(self, server: str, attempt: int, avoid: set[int], deadline: float) -> None:
        assert self._base_dir is not None
        t0 = time.monotonic()
        ports = _pick_ports(NODE_COUNT, avoid)
        for index, port in enumerate(ports):
            directory = self._base_dir / f"try{attempt}-node{index}-{port}"
            directory.mkdir()
            args = [
                server,
                "--port",
                str(port),
                "--dir",
                str(directory),
                "--cluster-node-timeout",
                str(self._node_timeout_ms),
                *_BASE_ARGS,
                *self._extra_args,
                *self._node_extra_args.get(index, ()),
            ]
            node = _Node(port=port, directory=directory, args=args)
            self._nodes[port] = node
            self._spawn(node)
        for port in ports:
            self._wait_answers(self._nodes[port], deadline)
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

    def _spawn(self, node: _Node) -> None:
        with node.log_path.open("ab") as log:
            node.proc = subprocess.Popen(
                node.args,
                cwd=node.directory,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def _wait_answers(self, node: _Node, deadline: float) -> None:
        def why_not() -> str | None:
            if not node.running():
                if "Address already in use" in node.log_tail():
                    raise _PortTakenError(f"port {node.port} was taken")
                raise ClusterError(f"node {node.port} exited during start-up")
            try:
                self._cmd(node.port, "PING")
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                return f"node {node.port} does not answer: {exc}"
            return None

        self._wait(deadline, f"node {node.port} to answer", why_not)

    def _failure_report(self, exc: BaseException) -> str:
        parts = [f"local Redis Cluster failed to start: {exc!r}", f"phases: {self._phases}"]
        for node in self._nodes.values():
            state = "running" if node.running() else f"exited ({self._returncode(node)})"
            parts.append(f"--- node {node.port} [{state}] {node.log_path}\n{node.log_tail()}")
        return "\n".join(parts)

    @staticmethod
    def _returncode(node: _Node) -> int | None:
        return None if node.proc is None else node.proc.returncode

    # ------------------------------------------------------------------ queries

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

    @property
    def ports(self) -> list[int]:
        """All six node ports, running or not, in start-up order (empty once stopped)."""
        return list(self._nodes)

    @property
    def pids(self) -> list[int]:
        """Pids of the node processes that are running now."""
        return [n.proc.pid for n in self._nodes.values() if n.proc is not None and n.running()]

    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        """(host, port) of every node, for `RedisCluster(startup_nodes=...)`."""
        return [(HOST, port) for port in self._nodes]

    @property
    def url(self) -> str:
        """`redis://` URL of one running node (the first in start-up order)."""
        for port in self.live_ports():
            return f"redis://{HOST}:{port}"
        raise ClusterError("no node is running")

    def live_ports(self) -> list[int]:
        """Ports of the nodes whose process is running."""
        return [port for port, node in self._nodes.items() if node.running()]

    def node_pid(self, port: int) -> int:
        """Pid of the node process on `port` (it may have been killed since)."""
        node = self._node(port)
        if node.proc is None:
            raise ClusterError(f"node {port} was never started")
        return node.proc.pid

    def role(self, port: int) -> str:
        """`master` or `slave`, as the node reports it (`ROLE`)."""
        return str(self._cmd(port, "ROLE")[0])

    def cluster_info(self, port: int) -> dict[str, str]:
        """`CLUSTER INFO` of one node, e.g. `info["cluster_state"] == "ok"`."""
        return _parse_info(str(self._cmd(port, "CLUSTER", "INFO")))

    def primaries(self) -> list[int]:
        """Ports of the running nodes that report role master, in start-up order."""
        return [port for port in self.live_ports() if self._role_reply(port)[0] == "master"]

    def replicas(self) -> list[int]:
        """Ports of the running nodes that report role slave, in start-up order."""
        return [port for port in self.live_ports() if self._role_reply(port)[0] == "slave"]

    def replica_of(self, primary_port: int) -> int:
        """Port of a running replica that replicates `primary_port`.

        Raises:
            ClusterError: the primary has no running replica.
        """
        for port in self.live_ports():
            reply = self._role_reply(port)
            if reply[0] == "slave" and int(reply[2]) == primary_port:
                return port
        raise ClusterError(f"node {primary_port} has no running replica")

    def slot_owners(self, port: int | None = None) -> list[tuple[int, int]]:
        """Slot ranges (first, last) that `port` owns, as seen by `port` itself.

        With `port=None`, all slot ranges of the cluster as seen by the first
        running node.
        """
        asked = port if port is not None else self.live_ports()[0]
        return [
            (first, last)
            for (first, last), owner in self._slot_map(asked).items()
            if port is None or owner == port
        ]

    # ------------------------------------------------------------------ faults

    def kill_node(self, port: int) -> None:
        """SIGKILL the node on `port` and reap it. Its directory is kept."""
        node = self._node(port)
        if not node.running():
            raise ClusterError(f"node {port} is not running")
        assert node.proc is not None
        node.proc.kill()
        node.proc.wait(timeout=10)
        self._close_client(node)

    def restart_node(self, port: int, timeout_s: float = 30.0) -> None:
        """Start a killed node again on the same port and directory.

        It keeps its `nodes.conf` identity: a primary that was failed over comes
        back as a replica of its successor. Returns once the node reports
        `cluster_state:ok` and, if it is a replica, `master_link_status:up`.
        """
        node = self._node(port)
        if node.running():
            raise ClusterError(f"node {port} is still running")
        deadline = time.monotonic() + timeout_s
        self._spawn(node)
        self._wait_answers(node, deadline)

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
            if self._node(old_primary).running():
                old = self._role_reply(old_primary)
                if old[0] != "slave" or int(old[2]) != replica_port:
                    return f"old primary {old_primary} does not replicate {replica_port} yet"
                return self._why_link_down(old_primary)
            return None

        self._wait(deadline, f"graceful failover to {replica_port}", why_not)
        self.wait_settled(max(0.0, deadline - time.monotonic()))
        return time.monotonic() - started

    def wait_role(self, port: int, role: str, timeout_s: float = 30.0) -> float:
        """Wait until the node on `port` reports `role`; return the seconds waited."""
        started = time.monotonic()

        def why_not() -> str | None:
            current = self.role(port)
            return None if current == role else f"node {port} is {current}"

        self._wait(started + timeout_s, f"node {port} to become {role}", why_not)
        return time.monotonic() - started

    def wait_settled(self, timeout_s: float = 30.0) -> None:
        """Wait until every running node reports `cluster_state:ok` and all of them
        map every slot range to the same running primary."""
        self._wait(time.monotonic() + timeout_s, "the cluster to settle", self._why_unsettled)

    # ------------------------------------------------------------------ conditions

    def _why_not_up(self) -> str | None:
        for port in self.live_ports():
            state = self.cluster_info(port).get("cluster_state")
            if state != "ok":
                return f"node {port} reports cluster_state:{state}"
            reason = self._why_link_down(port)
            if reason is not None:
                return reason
        return None

    def _why_links_down(self) -> str | None:
        for port in self.live_ports():
            reason = self._why_link_down(port)
            if reason is not None:
                return reason
        return None

    def _why_link_down(self, port: int) -> str | None:
        reply = self._role_reply(port)
        if reply[0] == "slave" and reply[3] != "connected":
            return f"replica {port} link to {reply[2]} is {reply[3]}"
        return None

    def _why_replicas_hidden(self) -> str | None:
        for port in self.live_ports():
            slots = self._cmd(port, "CLUSTER", "SLOTS")
            for entry in slots:
                if len(entry) < 4:  # [first, last, primary, replica...]
                    return f"node {port} lists no replica for slots {entry[0]}-{entry[1]}"
        return None

    def _why_unsettled(self) -> str | None:
        live = self.live_ports()
        if not live:
            return "no node is running"
        maps: dict[int, dict[tuple[int, int], int]] = {}
        for port in live:
            state = self.cluster_info(port).get("cluster_state")
            if state != "ok":
                return f"node {port} reports cluster_state:{state}"
            maps[port] = self._slot_map(port)
        reference = maps[live[0]]
        if sum(last - first + 1 for first, last in reference) != SLOT_COUNT:
            return f"node {live[0]} does not cover all slots"
        for port, slot_map in maps.items():
            if slot_map != reference:
                return f"nodes {live[0]} and {port} disagree on slot owners"
        dead_owners = set(reference.values()) - set(live)
        if dead_owners:
            return f"slots are still owned by stopped nodes {sorted(dead_owners)}"
        return None

    # ------------------------------------------------------------------ plumbing

    def _node(self, port: int) -> _Node:
        try:
            return self._nodes[port]
        except KeyError:
            raise ClusterError(f"no node on port {port}") from None

    def _client(self, port: int) -> redis.Redis:
        node = self._node(port)
        if node.client is None:
            # No retries: a dead node must fail fast, polling loops retry anyway.
            node.client = redis.Redis(
                host=HOST,
                port=port,
                decode_responses=True,
                socket_timeout=2.0,
                socket_connect_timeout=1.0,
                retry=Retry(NoBackoff(), 0),
            )
        return node.client

    @staticmethod
    def _close_client(node: _Node) -> None:
        if node.client is not None:
            node.client.close()
            node.client = None

    def _cmd(self, port: int, *args: str | int) -> Any:
        """One raw command to one node. Multi-word commands are passed as separate
        arguments, so redis-py applies no response callback: replies stay raw."""
        # redis-py leaves the sync `execute_command` unannotated.
        return self._client(port).execute_command(*args)  # type: ignore[no-untyped-call]

    def _role_reply(self, port: int) -> list[Any]:
        reply = self._cmd(port, "ROLE")
        if not isinstance(reply, list) or not reply:
            raise ClusterError(f"unexpected ROLE reply from {port}: {reply!r}")
        return reply

    def _slot_map(self, port: int) -> dict[tuple[int, int], int]:
        """`CLUSTER SLOTS` of one node as {(first, last): primary port}."""
        return {
            (int(entry[0]), int(entry[1])): int(entry[2][1])
            for entry in self._cmd(port, "CLUSTER", "SLOTS")
        }

    def _wait(self, deadline: float, what: str, why_not: Callable[[], str | None]) -> None:
        """Poll `why_not` (None means done) until the deadline.

        Connection errors count as "not yet": nodes restart and fail over while
        we poll.
        """
        reason: str | None = "never checked"
        while True:
            try:
                reason = why_not()
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                reason = f"{type(exc).__name__}: {exc}"
            if reason is None:
                return
            if time.monotonic() >= deadline:
                raise ClusterError(f"timed out waiting for {what}; last: {reason}")
            time.sleep(_POLL_INTERVAL_S)

    def __repr__(self) -> str:
        return f"LocalCluster(ports={self.ports}, live={self.live_ports()})"
