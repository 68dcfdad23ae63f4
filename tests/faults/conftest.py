"""The fault suite: processes killed and stopped, servers restarted, each test on a
private ``redis-server`` of its own (destructive: never the session's). Every test here
is marked ``redis`` and ``faults``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from redis import Redis as SyncRedis

from streamjobs.testing import RedisServer
from tests.harness.markers import mark_folder
from tests.harness.plugin import RedisServerFactory


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    mark_folder(items, Path(__file__).parent, pytest.mark.redis, pytest.mark.faults)


@pytest.fixture
def server(redis_server_factory: RedisServerFactory) -> RedisServer:
    """The test's private server (a test that needs other settings overrides this)."""
    return redis_server_factory()


@pytest.fixture
def sync(server: RedisServer) -> Iterator[SyncRedis]:
    """A synchronous client of ``server`` (its URL carries the password, if any)."""
    r = SyncRedis.from_url(server.url)
    yield r
    r.close()
