"""Where the tests' Redis and Redis Cluster come from, and what happens without them.

Redis (see :func:`choose_redis_source`):

1. ``STREAMJOBS_TEST_REDIS_URL``: an existing server; only keys holding a test's
   uid are ever deleted from it;
2. a private ``redis-server`` child for the session, if the binary is on PATH (else
   ``valkey-server``, else the bundled Valkey of the ``server`` extra);
3. a ``redis:7`` container via testcontainers, if a Docker engine answers;
4. otherwise the test is skipped, except under ``CI=true`` where it fails.

Redis Cluster:

1. ``STREAMJOBS_TEST_CLUSTER_URL``: an existing cluster, never modified;
2. a private 3 + 3 :class:`~streamjobs.testing.LocalCluster`, if ``redis-server``
   (or one of its fallbacks) is there;
3. otherwise a skip, or a failure under ``CI=true``.
"""

from __future__ import annotations

import contextlib
import gc
import os
import shutil
import subprocess
import warnings
from collections.abc import Iterator, Mapping
from typing import Final, Literal, NoReturn

import pytest
from redis import Redis as SyncRedis
from redis import RedisError
from redis.cluster import RedisCluster as SyncRedisCluster

from streamjobs.testing import RedisServer, answers, server_binary
from tests.harness.cluster import ExternalCluster

ENV_REDIS_URL: Final = "STREAMJOBS_TEST_REDIS_URL"
"""Environment variable naming an existing Redis to test against."""

ENV_CLUSTER_URL: Final = "STREAMJOBS_TEST_CLUSTER_URL"
"""Environment variable naming an existing Redis Cluster (any node's URL)."""

DOCKER_IMAGE: Final = "redis:7"

HOW_TO_GET_A_CLUSTER: Final = (
    f"set {ENV_CLUSTER_URL}, put redis-server (Redis 7+) on PATH, or install the "
    "server extra (pip install -e '.[server]')"
)

RedisSource = Literal["env", "spawn", "docker", "skip", "fail"]


def is_ci(env: Mapping[str, str]) -> bool:
    """True when ``CI`` is ``true`` (any case): there a missing Redis is a failure."""
    return env.get("CI", "").strip().lower() == "true"


def choose_redis_source(env: Mapping[str, str], has_binary: bool, has_docker: bool) -> RedisSource:
    """Decide where the session's Redis comes from (the order in the module docstring)."""
    if env.get(ENV_REDIS_URL, "").strip():
        return "env"
    if has_binary:
        return "spawn"
    if has_docker:
        return "docker"
    return "fail" if is_ci(env) else "skip"


def redis_server_binary() -> str | None:
    """The server to spawn: ``redis-server`` on PATH, else ``valkey-server``, else the
    bundled Valkey of the ``server`` extra (``streamjobs.testing.server_binary``)."""
    return server_binary()


def cluster_binaries_available() -> bool:
    """Whether a server binary is there (the cluster is built with CLUSTER commands:
    no ``redis-cli`` needed)."""
    return redis_server_binary() is not None


def docker_engine_available(timeout: float = 5.0) -> bool:
    """True if a Docker engine answers ``docker info`` within *timeout* seconds."""
    docker = shutil.which("docker")
    if docker is None:
        return False
    try:
        result = subprocess.run(
            [docker, "info", "--format", "{{.ServerVersion}}"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return result.returncode == 0


def missing(reason: str, what: str = "Redis") -> NoReturn:
    """Skip the test, or fail it under ``CI=true`` (there a missing *what* is an error)."""
    if is_ci(os.environ):
        pytest.fail(f"{reason} (CI=true: a missing {what} is an error, not a skip)")
    pytest.skip(reason)


@contextlib.contextmanager
def session_redis_url() -> Iterator[str]:
    """The URL of the Redis for this session, from the first source that has one."""
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
        with _docker_redis_url() as url:
            yield url
    else:
        missing(
            f"no Redis for the tests: set {ENV_REDIS_URL}, put redis-server on PATH, "
            "or run a Docker engine"
        )


@contextlib.contextmanager
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
        url = f"redis://{host}:{int(container.get_exposed_port(6379))}/0"
        if not answers(url, timeout_s=5.0):
            pytest.fail(f"the {DOCKER_IMAGE} container at {url} does not answer PING")
        yield url
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            container.stop()
            gc.collect()


def external_cluster(url: str) -> ExternalCluster:
    """Wrap the cluster at ``url`` after checking that it answers and is healthy."""
    try:
        with SyncRedisCluster.from_url(url, socket_connect_timeout=5, socket_timeout=5) as rc:
            state = rc.cluster_info().get("cluster_state")
    except (RedisError, OSError) as exc:
        pytest.fail(f"{ENV_CLUSTER_URL}={url} is not a reachable Redis Cluster: {exc!r}")
    if state != "ok":
        pytest.fail(f"{ENV_CLUSTER_URL}={url} reports cluster_state:{state}")
    return ExternalCluster(url=url)


def cluster_url_from_env() -> str:
    """``STREAMJOBS_TEST_CLUSTER_URL``, stripped ('' when unset)."""
    return os.environ.get(ENV_CLUSTER_URL, "").strip()
