"""Shared fixtures: where Redis comes from, per-test names, and private servers.

Redis is found in this order (see :func:`choose_redis_source`):

1. ``STREAMJOBS_TEST_REDIS_URL`` (an existing server; only keys holding the test's uid
   are ever deleted from it);
2. a private ``redis-server`` child for the session, if the binary is on PATH;
3. a ``redis:7`` container via testcontainers, if a Docker engine answers;
4. otherwise the test is skipped, except under ``CI=true`` where it fails.
"""

from __future__ import annotations

import gc
import os
import uuid
import warnings
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import NoReturn

import pytest
from redis import Redis as SyncRedis
from redis import RedisError
from redis.asyncio import Redis as AsyncRedis

from tests._cluster_fixtures import (  # noqa: F401  (fixtures, shared session-wide)
    cluster_client,
    fresh_cluster,
    redis_cluster,
    require_cluster_binaries,
)
from tests._servers import (
    ENV_REDIS_URL,
    RedisServer,
    RedisServerFactory,
    delete_keys_containing,
    docker_engine_available,
    is_ci,
    ping,
    redis_server_binary,
)
from tests._servers import (
    choose_redis_source as choose_redis_source,  # re-exported: the pure decision logic
)

DOCKER_IMAGE = "redis:7"


def _no_redis(reason: str) -> NoReturn:
    """Skip the test, or fail it under ``CI=true``."""
    if is_ci(os.environ):
        pytest.fail(f"{reason} (CI=true: a missing Redis is an error, not a skip)")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """URL of the Redis the session's tests share (db 0)."""
    has_binary = redis_server_binary() is not None
    # `docker info` can take seconds: only ask when it would matter.
    needs_docker = not has_binary and not os.environ.get(ENV_REDIS_URL, "").strip()
    has_docker = needs_docker and docker_engine_available()
    source = choose_redis_source(os.environ, has_binary, has_docker)

    if source == "env":
        url = os.environ[ENV_REDIS_URL].strip()
        with SyncRedis.from_url(url, socket_connect_timeout=5, socket_timeout=5) as client:
            try:
                client.ping()
            except (RedisError, OSError) as exc:
                pytest.fail(f"{ENV_REDIS_URL}={url} does not answer PING: {exc!r}")
        yield url
    elif source == "spawn":
        with RedisServer() as server:
            yield server.url
    elif source == "docker":
        yield from _docker_redis_url()
    elif source == "fail":
        pytest.fail(
            f"no Redis for the tests: set {ENV_REDIS_URL}, put redis-server on PATH, "
            "or run a Docker engine (CI=true: a missing Redis is an error, not a skip)"
        )
    else:
        pytest.skip(
            f"no Redis for the tests: set {ENV_REDIS_URL}, put redis-server on PATH, "
            "or run a Docker engine"
        )


def _docker_redis_url() -> Iterator[str]:
    with warnings.catch_warnings():
        # testcontainers and docker-py emit deprecation and unclosed-socket warnings of
        # their own, which filterwarnings=error would turn into test errors.
        warnings.simplefilter("ignore")
        from testcontainers.community.redis import RedisContainer

        container = RedisContainer(DOCKER_IMAGE)
        try:
            container.start()
        except BaseException:
            container.stop()
            raise
        gc.collect()  # collect the readiness probe's client while warnings are off
    try:
        host = container.get_container_host_ip()
        port = int(container.get_exposed_port(6379))
        if not ping(host, port, timeout=5.0):
            pytest.fail(f"the {DOCKER_IMAGE} container at {host}:{port} does not answer PING")
        yield f"redis://{host}:{port}/0"
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            container.stop()
            gc.collect()


@pytest.fixture
def uid() -> str:
    """A fresh 12-hex-digit id; put it in every service and key name the test uses."""
    return uuid.uuid4().hex[:12]


@pytest.fixture
def service(uid: str) -> str:
    return f"svc-{uid}"


@pytest.fixture
async def redis(redis_url: str, uid: str) -> AsyncIterator[AsyncRedis]:
    """An async client (bytes responses) on the session Redis.

    At teardown every key whose name contains ``uid`` is deleted (SCAN + DEL, never a
    flush), then the client is closed.
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
        _no_redis("redis-server is not on PATH (needed for a private server)")
    return binary


@pytest.fixture
def redis_server_factory(require_redis_server: str) -> Iterator[RedisServerFactory]:
    """Start private, disposable servers for destructive tests (restarts, kills,
    CONFIG SET, ``--hz``).  Each call returns a started :class:`RedisServer`; all of
    them are stopped, and their directories removed, at teardown."""
    servers: list[RedisServer] = []

    def factory(
        *,
        appendonly: bool = False,
        extra_args: Sequence[str] = (),
        port: int | None = None,
    ) -> RedisServer:
        server = RedisServer(
            appendonly=appendonly, extra_args=extra_args, port=port, binary=require_redis_server
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
