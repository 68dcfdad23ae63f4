"""The cluster suite: a real Redis Cluster of 3 primaries and 3 replicas (the session's,
or a private one for a destructive test). Every test here is marked ``redis`` and
``cluster``; those that kill or fail over nodes are marked ``faults`` as well."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness.markers import mark_folder


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    mark_folder(items, Path(__file__).parent, pytest.mark.redis, pytest.mark.cluster)
