"""The integration suite: real Redis (the session's server), run against a standalone
server and against a real cluster. Every test here is marked ``redis``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.harness.markers import mark_folder


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    mark_folder(items, Path(__file__).parent, pytest.mark.redis)


@pytest.fixture(params=["standalone", pytest.param("cluster", marks=pytest.mark.cluster)])
def redis(request: pytest.FixtureRequest, redis: Any) -> Any:
    """The parent ``redis`` (standalone) or a ``RedisCluster`` on the session cluster."""
    if request.param == "cluster":
        return request.getfixturevalue("cluster_client")
    return redis
