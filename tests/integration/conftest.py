"""The integration suite runs against a standalone server and against a real cluster."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(params=["standalone", pytest.param("cluster", marks=pytest.mark.cluster)])
def redis(request: pytest.FixtureRequest, redis: Any) -> Any:
    """The parent ``redis`` (standalone) or a ``RedisCluster`` on the session cluster."""
    if request.param == "cluster":
        return request.getfixturevalue("cluster_client")
    return redis
