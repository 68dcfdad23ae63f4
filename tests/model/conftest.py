"""The stateful model tests (hypothesis, tests/harness/seams_model.py): the same machine
over the in-memory gateway and over real Redis. Those that take a Redis fixture are
marked ``redis``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness.markers import mark_folder

REDIS_FIXTURES = frozenset({"redis", "redis_url", "redis_server_factory"})


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    on_redis = [i for i in items if REDIS_FIXTURES & set(getattr(i, "fixturenames", ()))]
    mark_folder(on_redis, Path(__file__).parent, pytest.mark.redis)
