"""The unit tests: in memory only (no Redis, no network, no subprocess), the whole
folder in well under a minute. Streams run through ``Runtime`` over the in-memory
gateway (tests/fakes/); tests that start a process or open a socket go to tests/tools/,
tests that need Redis to tests/integration/."""

from __future__ import annotations

import pytest

from tests.fakes.gateway import FakeGateway
from tests.fakes.runtime import manual_fake


@pytest.fixture
def fake() -> FakeGateway:
    """An empty in-memory gateway on a manual clock: a lock expires only when the test
    expires it."""
    return manual_fake()
