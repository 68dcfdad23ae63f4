"""What a :class:`~streamjobs.testing.LocalCluster` can be asked, and how it waits:
the nodes' roles, slot owners and cluster state, read with plain commands, and the
conditions its start-up and faults wait for."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Final

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from ..exceptions import StreamJobsError
from ._process import HOST
from ._server import RedisServer

SLOT_COUNT: Final = 16384
_POLL_INTERVAL_S: Final = 0.02


class ClusterError(StreamJobsError, RuntimeError):
    """The local cluster did not reach or keep the state a caller asked for."""


class ClusterStartupError(ClusterError):
    """The cluster could not be started; the message carries the nodes' log tails."""


def _parse_info(text: str) -> dict[str, str]:
    info: dict[str, str] = {}
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if sep:
            info[name.strip()] = value.strip()
    return info


class ClusterView:
    """The queries and waits of a cluster of :class:`RedisServer` nodes, keyed by port.

    :class:`~streamjobs.testing.LocalCluster` is one; it fills ``_nodes``.
    """

    _nodes: dict[int, RedisServer]
    _clients: dict[int, redis.Redis]

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
