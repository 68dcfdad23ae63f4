"""The data store the soak damages: a private standalone server or a private 3+3 cluster.

Both are synchronous, like the process helpers they wrap; the runner calls the slow
methods through ``anyio.to_thread``. Every node is a child of this process and is
stopped by :meth:`Store.stop` (which also removes its directory).
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable
from typing import Any, Final, TypeVar

import redis
from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry

from streamjobs.testing import HOST, RedisServer, server_binary

T = TypeVar("T")

# Fault kinds. Each target supports the worker faults, connection drops and one
# kind of server fault.
KILL9: Final = "kill9"
SIGSTOP: Final = "sigstop"
SIGTERM: Final = "sigterm"
CONN_DROP: Final = "conndrop"
SERVER_RESTART: Final = "restart"  # standalone: kill -9 the server, start it from its AOF
PRIMARY_KILL: Final = "primary"  # cluster: kill -9 a primary, restart it once failed over

_CLIENT_TIMEOUTS: Final[dict[str, Any]] = {"socket_timeout": 5.0, "socket_connect_timeout": 2.0}


def _admin(port: int) -> Any:
    """A short-lived client for one node: no retries, short timeouts."""
    return redis.Redis(
        host=HOST,
        port=port,
        socket_timeout=2.0,
        socket_connect_timeout=1.0,
        retry=Retry(NoBackoff(), 0),
        decode_responses=True,
    )


def _scan(client: Any, pattern: str) -> list[str]:
    return [str(key) for key in client.scan_iter(match=pattern, count=1000)]


def retrying(fn: Callable[[], T], attempts: int = 5) -> T:
    """Call ``fn``, again after a connection error (a dropped admin connection)."""
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except (redis.ConnectionError, redis.TimeoutError):
            if attempt == attempts:
                raise
            time.sleep(0.1 * attempt)
    raise AssertionError("unreachable")  # pragma: no cover


class Store:
    """What the runner needs of a target."""

    target: str = ""
    server_fault: str = ""

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def worker_url(self) -> str:
        """The ``--redis-url`` for a worker started now (a node that is up)."""
        raise NotImplementedError

    def worker_args(self) -> list[str]:
        return []

    def client(self, *, retries: bool) -> Any:
        """A new async client; ``retries=False``: redis-py never re-sends a command."""
        raise NotImplementedError

    def live_ports(self) -> list[int]:
        """Ports of the data nodes whose process runs (connection drops go there)."""
        raise NotImplementedError

    def primary_ports(self) -> list[int]:
        """Ports of the nodes that hold keys (lock scans go there)."""
        raise NotImplementedError

    def healthy(self) -> bool:
        """Every node runs (a server fault may be injected now)."""
        raise NotImplementedError

    def log_tails(self, lines: int) -> str:
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError

    # -- helpers on every live node ------------------------------------------------------

    def drop_connections(self) -> int:
        """``CLIENT KILL TYPE normal`` on every live data node; returns how many died."""
        killed = 0
        for port in self.live_ports():
            client = _admin(port)
            try:
                killed += int(client.execute_command("CLIENT", "KILL", "TYPE", "normal"))
            except (redis.ConnectionError, redis.TimeoutError):
                pass  # the node is going down: nothing to drop
            finally:
                client.close()
        return killed

    def keys_matching(self, pattern: str) -> list[str]:
        """Every key matching ``pattern`` on the primaries (SCAN, never KEYS)."""
        found: list[str] = []
        for port in self.primary_ports():
            client = _admin(port)
            try:
                found.extend(retrying(functools.partial(_scan, client, pattern)))
            finally:
                client.close()
        return found


class StandaloneStore(Store):
    """A private ``redis-server --appendonly yes --appendfsync always``."""

    target = "standalone"
    server_fault = SERVER_RESTART

    def __init__(self) -> None:
        self.server = RedisServer(appendonly=True, dir_prefix="soak-data-")

    def start(self) -> None:
        self.server.start()

    def stop(self) -> None:
        self.server.stop()

    def worker_url(self) -> str:
        return self.server.url

    def client(self, *, retries: bool) -> Any:
        extra: dict[str, Any] = {} if retries else {"retry": AsyncRetry(NoBackoff(), 0)}
        return Redis.from_url(self.server.url, **_CLIENT_TIMEOUTS, **extra)

    def live_ports(self) -> list[int]:
        return [self.server.port] if self.server.running else []

    def primary_ports(self) -> list[int]:
        return [self.server.port]

    def healthy(self) -> bool:
        return self.server.running

    def crash(self) -> None:
        """SIGKILL the server (its AOF stays)."""
        self.server.kill()

    def recover(self) -> None:
        """Start the server again from its AOF; returns once it answers PING."""
        self.server.start()

    def log_tails(self, lines: int) -> str:
        return f"--- data server {self.server.port} ---\n{self.server.log_tail(lines)}"

    def describe(self) -> str:
        # The server the matrix picked ($STREAMJOBS_SERVER_BINARY): Valkey in its job.
        name = os.path.basename(server_binary() or "redis-server")
        return f"{name} on {HOST}:{self.server.port} (appendonly, fsync always)"


class ClusterStore(Store):
    """A private :class:`~streamjobs.testing.LocalCluster` (3 primaries + 3 replicas)."""

    target = "cluster"
    server_fault = PRIMARY_KILL

    def __init__(self) -> None:
        # Imported here: the harness lives in tests/, importable from the repo root.
        from streamjobs.testing import LocalCluster

        self.cluster = LocalCluster()
        # LocalCluster keeps one client per node and is not meant for concurrent use.
        self._lock = threading.RLock()

    def start(self) -> None:
        self.cluster.start()

    def stop(self) -> None:
        self.cluster.stop()

    def worker_url(self) -> str:
        return f"redis://{HOST}:{self.primary_ports()[0]}"

    def worker_args(self) -> list[str]:
        return ["--cluster"]

    def client(self, *, retries: bool) -> Any:
        extra: dict[str, Any] = {} if retries else {"retry": AsyncRetry(NoBackoff(), 0)}
        nodes = [ClusterNode(host, port) for host, port in self.cluster.startup_nodes]
        return RedisCluster(startup_nodes=nodes, **_CLIENT_TIMEOUTS, **extra)

    def live_ports(self) -> list[int]:
        return self.cluster.live_ports()

    def primary_ports(self) -> list[int]:
        with self._lock:
            return retrying(self.cluster.primaries)

    def healthy(self) -> bool:
        if len(self.cluster.live_ports()) != len(self.cluster.ports):
            return False
        with self._lock:
            try:
                self.cluster.wait_settled(timeout_s=1.0)
            except Exception:
                return False
        return True

    def crash_primary(self, port: int) -> int:
        """SIGKILL primary ``port``; returns the port of the replica that will take over."""
        with self._lock:
            replica = retrying(lambda: self.cluster.replica_of(port))
            self.cluster.kill_node(port)
        return replica

    def await_failover(self, replica: int, timeout_s: float = 30.0) -> float:
        """Wait until ``replica`` is a primary and the cluster is settled; returns seconds."""
        started = time.monotonic()
        with self._lock:
            self.cluster.wait_role(replica, "master", timeout_s)
            self.cluster.wait_settled(timeout_s)
        return time.monotonic() - started

    def restart_node(self, port: int, timeout_s: float = 30.0) -> None:
        """Start a killed node again (it rejoins as a replica) and wait until settled."""
        with self._lock:
            self.cluster.restart_node(port, timeout_s)
            self.cluster.wait_settled(timeout_s)

    def log_tails(self, lines: int) -> str:
        parts = []
        for port in self.cluster.ports:
            node = self.cluster.node(port)
            state = "running" if node.running else f"exited ({node.returncode})"
            parts.append(f"--- cluster node {port} [{state}] ---\n{node.log_tail(lines)}")
        return "\n".join(parts)

    def describe(self) -> str:
        return f"local Redis Cluster 3+3 on ports {self.cluster.ports}"
