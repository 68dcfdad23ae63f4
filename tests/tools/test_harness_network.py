"""The harness where it touches the network but needs no Redis: free ports for private
servers, and a session Redis URL that does not answer (the harness's pure logic:
tests/unit/test_harness.py)."""

from __future__ import annotations

import pytest

from streamjobs.testing import RESERVED_PORTS, free_port
from tests.harness.sources import ENV_REDIS_URL, choose_redis_source, session_redis_url


def test_the_session_redis_follows_the_decision(monkeypatch: pytest.MonkeyPatch) -> None:
    # "env" wins over a redis-server on PATH, and an URL that does not answer is a
    # failure, never a silent fall-back to another source.
    monkeypatch.setenv(ENV_REDIS_URL, "redis://127.0.0.1:1/0")
    assert choose_redis_source({ENV_REDIS_URL: "redis://127.0.0.1:1/0"}, True, True) == "env"
    with pytest.raises(pytest.fail.Exception, match="does not answer PING"), session_redis_url():
        pass


def test_free_port_avoids_reserved_range() -> None:
    ports = {free_port() for _ in range(20)}
    assert all(1024 <= p <= 65535 for p in ports)
    assert not ports & set(RESERVED_PORTS)
    assert 6379 in RESERVED_PORTS
    assert 6400 in RESERVED_PORTS
