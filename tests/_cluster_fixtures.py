"""Fixtures for tests that need a real OSS Redis Cluster (imported by tests/conftest.py,
so the whole session shares one cluster).

Where the cluster comes from:

1. ``STREAMJOBS_TEST_CLUSTER_URL`` names an existing cluster: ``redis_cluster`` wraps
   it (only ``url`` and ``startup_nodes``) and never modifies it;
2. otherwise, with ``redis-server`` and ``redis-cli`` on PATH, a private 3 + 3
   :class:`~tests._cluster.LocalCluster` is started for the session (about 2 s);
3. otherwise the tests are skipped, except under ``CI=true`` where they fail.

Destructive tests (kills, failovers, restarts) take ``fresh_cluster``: a cluster of
their own, stopped after the test. They are skipped when no cluster can be spawned
but an external one was given (it must not be damaged). To start it with extra
``redis-server`` arguments, parametrize it indirectly::

    @pytest.mark.parametrize(
        "fresh_cluster", [{"extra_args": ["--notify-keyspace-events", "Kx"]}], indirect=True
    )

The dict holds keyword arguments for :class:`~tests._cluster.LocalCluster`.
"""

from __future__ import annotations

import gc
import os
from collections.abc import AsyncIterator, Iterator
from typing import Any, Final, NoReturn

import pytest
from redis import RedisError
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.cluster import RedisCluster as SyncRedisCluster

from tests._cluster import ClusterEndpoint, ExternalCluster, LocalCluster, binaries_available
from tests._servers import is_ci

ENV_CLUSTER_URL: Final = "STREAMJOBS_TEST_CLUSTER_URL"
"""Environment variable naming an existing Redis Cluster (any node's URL)."""

_HOW_TO_GET_ONE: Final = (
    f"set {ENV_CLUSTER_URL} or put redis-server and redis-cli (Redis 7+) on PATH"
)


def _no_cluster(reason: str) -> NoReturn:
    """Skip the test, or fail it under ``CI=true`` (a missing cluster is an error there)."""
    if is_ci(os.environ):
        pytest.fail(f"{reason} (CI=true: a missing cluster is an error, not a skip)")
    pytest.skip(reason)


def _external_cluster(url: str) -> ExternalCluster:
    """Wrap the cluster at ``url`` after checking that it answers and is healthy."""
    try:
        with SyncRedisCluster.from_url(url, socket_connect_timeout=5, socket_timeout=5) as rc:
            state = rc.cluster_info().get("cluster_state")
    except (RedisError, OSError) as exc:
        pytest.fail(f"{ENV_CLUSTER_URL}={url} is not a reachable Redis Cluster: {exc!r}")
    if state != "ok":
        pytest.fail(f"{ENV_CLUSTER_URL}={url} reports cluster_state:{state}")
    return ExternalCluster(url=url)


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[ClusterEndpoint]:
    """The cluster the session's non-destructive tests share.

    Do not kill, fail over, reconfigure or flush it; name every key with the test's
    ``uid`` (``cluster_client`` deletes those keys afterwards).
    """
    url = os.environ.get(ENV_CLUSTER_URL, "").strip()
    if url:
        yield _external_cluster(url)
        return
    if not binaries_available():
        _no_cluster(f"no Redis Cluster for the tests: {_HOW_TO_GET_ONE}")
    with LocalCluster() as cluster:
        yield cluster


@pytest.fixture
def require_cluster_binaries() -> None:
    """Skip unless this test can start its own cluster (fail under ``CI=true``).

    With ``STREAMJOBS_TEST_CLUSTER_URL`` set it is a skip even under ``CI=true``: a
    cluster exists, it just must not be damaged.
    """
    if binaries_available():
        return
    if os.environ.get(ENV_CLUSTER_URL, "").strip():
        pytest.skip(
            "destructive cluster tests need their own cluster, and redis-server / "
            f"redis-cli are not on PATH ({ENV_CLUSTER_URL} is never damaged)"
        )
    _no_cluster(f"no Redis Cluster for the tests: {_HOW_TO_GET_ONE}")


@pytest.fixture
def fresh_cluster(
    request: pytest.FixtureRequest, require_cluster_binaries: None
) -> Iterator[LocalCluster]:
    """A private 3 + 3 cluster for one destructive test, stopped afterwards.

    Indirect parametrization passes keyword arguments to
    :class:`~tests._cluster.LocalCluster` (see the module docstring).
    """
    options: dict[str, Any] = dict(getattr(request, "param", {}))
    with LocalCluster(**options) as cluster:
        yield cluster


async def close_cluster_client(client: RedisCluster) -> None:
    """Close ``client`` and any node it orphaned.

    redis-py drops a node from its cache on a topology change even while one of the
    node's connections is in use (a blocking read during a failover, say); that
    connection goes back to the orphaned node later and nothing closes it. Closing
    every ClusterNode still alive keeps ResourceWarnings (errors here) meaningful.
    """
    await client.aclose()
    for obj in gc.get_objects():
        if isinstance(obj, ClusterNode):
            await obj.disconnect()


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
            async for key in client.scan_iter(match=f"*{uid}*", count=1000):
                await client.delete(key)
        finally:
            await close_cluster_client(client)
