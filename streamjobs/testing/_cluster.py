"""A real, local OSS Redis Cluster for tests: 3 primaries + 3 replicas.

`LocalCluster` runs six nodes, each a `RedisServer` (a foreground child of the
calling process with its own directory and log), and joins them into a cluster
(`_cluster_bringup.py`). Everything is synchronous and polls with deadlines; from
async code, call the slow methods through `anyio.to_thread.run_sync`.

Like the rest of `streamjobs.testing` it uses none of the consumer code: the
cluster is the ground truth that cluster tests are checked against.
"""

from __future__ import annotations

import atexit
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Self

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from ._cluster_bringup import bring_up
from ._cluster_errors import SLOT_COUNT, ClusterError, ClusterStartupError
from ._process import HOST, PortInUseError, RedisServerError, server_binary
from ._server import RedisServer

_START_ATTEMPTS: Final = 3
_LOG_TAIL_LINES: Final = 25
_POLL_INTERVAL_S: Final = 0.02


def _parse_info(text: str) -> dict[str, str]:
    info: dict[str, str] = {}
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if sep:
            info[name.strip()] = value.strip()
    return info


class LocalCluster:
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
                self._phases = bring_up(self, server, attempt, avoid, deadline)
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

    # -- the nodes' state

    @property
    def ports(self) -> list[int]:
        """All six node ports, running or not, in start-up order (empty once stopped)."""
        return list(self._nodes)

    @property
    def pids(self) -> list[int]:
        """Pids of the node processes that are running now."""
        return [node.pid for node in self._nodes.values() if node.running]

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

    def node(self, port: int) -> RedisServer:
        """The server of the node on `port` (running or not).

        Raises:
            ClusterError: no node of this cluster has that port.
        """
        try:
            return self._nodes[port]
        except KeyError:
            raise ClusterError(f"no node on port {port}") from None

    def live_ports(self) -> list[int]:
        """Ports of the nodes whose process is running."""
        return [port for port, node in self._nodes.items() if node.running]

    def node_pid(self, port: int) -> int:
        """Pid of the node process on `port` (it may have been killed since)."""
        try:
            return self.node(port).pid
        except RuntimeError:
            raise ClusterError(f"node {port} was never started") from None

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

    # -- conditions -------------------------------------------------------------------

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

    # -- plumbing ---------------------------------------------------------------------

    def _client(self, port: int) -> redis.Redis:
        client = self._clients.get(port)
        if client is None:
            self.node(port)  # a ClusterError for a port that is not ours
            # No retries: a dead node must fail fast, polling loops retry anyway.
            client = self._clients[port] = redis.Redis(
                host=HOST,
                port=port,
                decode_responses=True,
                socket_timeout=2.0,
                socket_connect_timeout=1.0,
                retry=Retry(NoBackoff(), 0),
            )
        return client

    def _close_client(self, port: int) -> None:
        client = self._clients.pop(port, None)
        if client is not None:
            client.close()

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
        return f"{type(self).__name__}(ports={self.ports}, live={self.live_ports()})"
