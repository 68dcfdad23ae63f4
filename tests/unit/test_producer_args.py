"""``Producer.add_stream`` refuses bad arguments before any I/O, naming the argument."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from streamjobs import ConfigurationError, Producer
from streamjobs._keys import Keys
from streamjobs._redis import Gateway
from streamjobs.producer import MAX_DEDUPE_WINDOW_S

pytestmark = pytest.mark.anyio


@pytest.fixture
async def producer() -> AsyncIterator[Producer]:
    # Nobody listens on port 1: a call that got as far as Redis would fail with
    # RedisUnavailable, not with the error under test.
    client = Redis(host="127.0.0.1", port=1)
    try:
        yield Producer(client, service="svc")
    finally:
        await client.aclose()


@pytest.mark.parametrize("key", ["", "\ud800", 5, b"key"])
async def test_a_bad_idempotency_key_is_refused(producer: Producer, key: object) -> None:
    with pytest.raises(ConfigurationError) as info:
        await producer.add_stream("s", idempotency_key=key)
    assert info.value.field == "idempotency_key"
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    "window", [0, -1.0, math.nan, math.inf, True, "60", None, MAX_DEDUPE_WINDOW_S * 2]
)
async def test_a_bad_dedupe_window_is_refused(producer: Producer, window: object) -> None:
    with pytest.raises(ConfigurationError) as info:
        await producer.add_stream(
            "s",
            idempotency_key="k",
            dedupe_window_s=window,
        )
    assert info.value.field == "dedupe_window_s"


async def test_the_gateway_refuses_a_key_without_a_window() -> None:
    """``SET PX 0`` would fail after the script's XADD: refused before sending it."""
    client = Redis(host="127.0.0.1", port=1)
    try:
        gw = Gateway(client, Keys("svc"))
        with pytest.raises(ConfigurationError) as info:
            await gw.writes.add_assignment("s", {"stream": "s"}, idempotency_key="k", window_ms=0)
        assert info.value.field == "window_ms"
    finally:
        await client.aclose()
