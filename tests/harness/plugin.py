"""The suite's pytest plugin: every shared fixture (registered by tests/conftest.py).

Where Redis and Redis Cluster come from is decided in :mod:`tests.harness.sources`.

Names: ``uid`` is fresh per test; put it in every key, stream and service name a
test uses (``service`` already holds it). The ``redis`` and ``cluster_client``
fixtures delete every key containing it afterwards (SCAN + DEL, never a flush).

Servers: ``redis_url`` is the session's shared server; destructive tests (restarts,
kills, ``CONFIG SET``) take private ones from ``redis_server_factory``.

Clusters: ``redis_cluster`` is shared by the session (about 2 s to start); tests that
kill, fail over or restart nodes take ``fresh_cluster``, a cluster of their own.
They are skipped when no cluster can be spawned but an external one was given (it
must not be damaged). To start it with extra ``redis-server`` arguments, parametrize
it indirectly with keyword arguments for
:class:`~streamjobs.testing.LocalCluster`::

    @pytest.mark.parametrize(
        "fresh_cluster", [{"extra_args": ["--notify-keyspace-events", "Kx"]}], indirect=True
    )

Consumers: ``consumer_factory`` builds consumers of the test's service on the
``redis`` client and closes them at teardown; ``worker_fleet_factory`` runs
``streamjobs worker`` subprocesses and stops them at teardown.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any, Final, Protocol, TypeVar

import anyio
import pytest
from redis.asyncio import Redis as AsyncRedis
from redis.asyncio.cluster import ClusterNode, RedisCluster

from streamjobs import ClusterMode, StreamConsumer
from streamjobs.testing import LocalCluster, RedisServer, WorkerFleet
from tests.harness.cluster import ClusterEndpoint, close_cluster_client
from tests.harness.keys import delete_keys_containing
from tests.harness.sources import (
    ENV_CLUSTER_URL,
    HOW_TO_GET_A_CLUSTER,
    cluster_binaries_available,
    cluster_url_from_env,
    external_cluster,
    missing,
    redis_server_binary,
    session_redis_url,
)

ROOT: Final = Path(__file__).resolve().parents[2]
"""The repository root: worker subprocesses import test modules from there."""

CONSUMER_CLOSE_TIMEOUT_S: Final = 30.0
"""How long ``consumer_factory`` waits for each consumer to stop at teardown."""

C = TypeVar("C", bound="StreamConsumer[Any]")


class RedisServerFactory(Protocol):
    """Type of the ``redis_server_factory`` fixture: returns a started server."""

    def __call__(
        self,
        *,
        appendonly: bool = False,
        extra_args: Sequence[str] = (),
        port: int | None = None,
        password: str | None = None,
    ) -> RedisServer: ...


class ConsumerFactory(Protocol):
    """Type of the ``consumer_factory`` fixture.

    ``make(cls, client=None, **kwargs)`` returns ``cls(client, service=..., cluster_mode=...,
    **kwargs)``: the test's ``service``, the ``redis`` fixture's client unless one is
    given, and the cluster mode that goes with that client. ``kwargs`` (``config``,
    ``recovery``, ``consumer_name``, ``metrics``, even ``service`` or
    ``cluster_mode``) pass through to the constructor.
    """

    def __call__(self, cls: type[C], client: Any = None, **kwargs: Any) -> C: ...


class WorkerFleetFactory(Protocol):
    """Type of the ``worker_fleet_factory`` fixture: returns a fleet with no worker yet."""

    def __call__(self, url: str, target: str, args: Sequence[str] = ()) -> WorkerFleet: ...


def cluster_mode_for(client: Any) -> ClusterMode:
    """The cluster mode that goes with a test client."""
    return ClusterMode.OSS if isinstance(client, RedisCluster) else ClusterMode.NONE


# -- names ------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def uid() -> str:
    """A fresh 12-hex-digit id; put it in every service and key name the test uses."""
    return uuid.uuid4().hex[:12]


@pytest.fixture
def service(uid: str) -> str:
    return f"svc-{uid}"


# -- standalone Redis -------------------------------------------------------------------


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """URL of the Redis the session's tests share (db 0)."""
    with session_redis_url() as url:
        yield url


@pytest.fixture
async def redis(redis_url: str, uid: str) -> AsyncIterator[AsyncRedis]:
    """An async client (bytes responses) on the session Redis.

    At teardown every key whose name contains ``uid`` is deleted, then the client is
    closed.
    """
    client = AsyncRedis.from_url(redis_url, decode_responses=False)
    try:
        yield client
    finally:
        try:
            await delete_keys_containing(client, uid)
        finally:
            await client.aclose()


@pytest.fixture
def require_redis_server() -> str:
    """Path of ``redis-server``; skips the test without one (fails under ``CI=true``)."""
    binary = redis_server_binary()
    if binary is None:
        missing("redis-server is not on PATH (needed for a private server)")
    return binary


@pytest.fixture
def redis_server_factory(require_redis_server: str) -> Iterator[RedisServerFactory]:
    """Start private, disposable servers for destructive tests (restarts, kills,
    CONFIG SET, ``--hz``). Each call returns a started
    :class:`~streamjobs.testing.RedisServer`; all of them are stopped, and their
    directories removed, at teardown."""
    servers: list[RedisServer] = []

    def factory(
        *,
        appendonly: bool = False,
        extra_args: Sequence[str] = (),
        port: int | None = None,
        password: str | None = None,
    ) -> RedisServer:
        server = RedisServer(
            appendonly=appendonly,
            extra_args=extra_args,
            port=port,
            binary=require_redis_server,
            password=password,
        )
        servers.append(server)
        return server.start()

    try:
        yield factory
    finally:
        errors: list[BaseException] = []
        for server in reversed(servers):
            try:
                server.stop()
            except Exception as exc:  # stop them all, then report
                errors.append(exc)
        if errors:
            raise errors[0]


# -- Redis Cluster ----------------------------------------------------------------------


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[ClusterEndpoint]:
    """The cluster the session's non-destructive tests share.

    Do not kill, fail over, reconfigure or flush it; name every key with the test's
    ``uid`` (``cluster_client`` deletes those keys afterwards).
    """
    url = cluster_url_from_env()
    if url:
        yield external_cluster(url)
        return
    if not cluster_binaries_available():
        missing(f"no Redis Cluster for the tests: {HOW_TO_GET_A_CLUSTER}", "cluster")
    with LocalCluster() as cluster:
        yield cluster


@pytest.fixture
def require_cluster_binaries() -> None:
    """Skip unless this test can start its own cluster (fail under ``CI=true``).

    With ``STREAMJOBS_TEST_CLUSTER_URL`` set it is a skip even under ``CI=true``: a
    cluster exists, it just must not be damaged.
    """
    if cluster_binaries_available():
        return
    if cluster_url_from_env():
        pytest.skip(
            "destructive cluster tests need their own cluster, and no server binary "
            f"is there ({ENV_CLUSTER_URL} is never damaged)"
        )
    missing(f"no Redis Cluster for the tests: {HOW_TO_GET_A_CLUSTER}", "cluster")


@pytest.fixture
def fresh_cluster(
    request: pytest.FixtureRequest, require_cluster_binaries: None
) -> Iterator[LocalCluster]:
    """A private 3 + 3 cluster for one destructive test, stopped afterwards.

    Indirect parametrization passes keyword arguments to
    :class:`~streamjobs.testing.LocalCluster` (see the module docstring).
    """
    options: dict[str, Any] = dict(getattr(request, "param", {}))
    with LocalCluster(**options) as cluster:
        yield cluster


@pytest.fixture
async def cluster_client(redis_cluster: ClusterEndpoint, uid: str) -> AsyncIterator[RedisCluster]:
    """An initialized ``redis.asyncio.RedisCluster`` (bytes responses) on the shared
    cluster. At teardown every key containing ``uid`` is deleted (SCAN on each
    primary + single-key DEL, never a flush), then the client is closed."""
    if isinstance(redis_cluster, LocalCluster):
        client = RedisCluster(
            startup_nodes=[ClusterNode(host, port) for host, port in redis_cluster.startup_nodes],
        )
    else:
        client = RedisCluster.from_url(redis_cluster.url)
    try:
        await client.initialize()
    except BaseException:
        await client.aclose()
        raise
    try:
        yield client
    finally:
        try:
            await delete_keys_containing(client, uid)
        finally:
            await close_cluster_client(client)


# -- consumers --------------------------------------------------------------------------


@pytest.fixture
async def consumer_factory(redis: Any, service: str) -> AsyncIterator[ConsumerFactory]:
    """Build consumers of the test's ``service`` (see :class:`ConsumerFactory`).

    At teardown every consumer it built is closed (``aclose()``, which returns at once
    for one that is not running), each within :data:`CONSUMER_CLOSE_TIMEOUT_S`; one
    that does not stop in time fails the test. Teardown runs before the ``redis``
    client's, so consumers never outlive their client.
    """
    built: list[StreamConsumer[Any]] = []

    def make(cls: type[C], client: Any = None, **kwargs: Any) -> C:
        target = redis if client is None else client
        kwargs.setdefault("service", service)
        kwargs.setdefault("cluster_mode", cluster_mode_for(target))
        consumer = cls(target, **kwargs)
        built.append(consumer)
        return consumer

    yield make
    stuck = []
    for consumer in reversed(built):
        with anyio.move_on_after(CONSUMER_CLOSE_TIMEOUT_S) as scope:
            await consumer.aclose()
        if scope.cancelled_caught:
            stuck.append(consumer.consumer_name)
    if stuck:
        pytest.fail(
            f"consumers still running {CONSUMER_CLOSE_TIMEOUT_S:g}s after aclose(): {stuck}"
        )


@pytest.fixture
def worker_fleet_factory(service: str) -> Iterator[WorkerFleetFactory]:
    """Fleets of ``streamjobs worker`` subprocesses of the test's ``service``.

    Workers run from the repository root with it on ``PYTHONPATH``, so a target such
    as ``tests.faults.workers:RecordingWorker`` imports. At teardown every worker is
    stopped gracefully (SIGKILL after a grace period) and its log tail printed, which
    pytest shows when the test failed.
    """
    fleets: list[WorkerFleet] = []

    def make(url: str, target: str, args: Sequence[str] = ()) -> WorkerFleet:
        fleet = WorkerFleet(url, service, target, args, pythonpath=[ROOT], cwd=ROOT)
        fleets.append(fleet)
        return fleet

    try:
        yield make
    finally:
        for fleet in fleets:
            fleet.stop_all()
            for worker in fleet.workers:
                print(f"--- {worker.name} (exit {worker.returncode}) ---\n{worker.log_tail(60)}")
            fleet.close()
