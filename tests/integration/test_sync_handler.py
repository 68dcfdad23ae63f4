"""A plain ``def handle()``: run in a worker thread with the same retries, timeout and
dead letters as a coroutine handler, against real Redis."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio import Redis as AsyncRedis

from streamjobs import ConfigurationError, ConsumerConfig, Message, Producer, StreamConsumer
from streamjobs._deadletter import parse_dead_letter
from streamjobs._keys import Keys
from tests.harness.plugin import ConsumerFactory

from ._helpers import eventually

pytestmark = pytest.mark.anyio

FAST = ConsumerConfig(lock_ttl_s=2, read_block_ms=50, handler_backoff_s=0.01)


class Blocking(StreamConsumer):
    """Blocking code, as a plain function: fails on "bad", sleeps on "slow"."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[tuple[str, int, bool]] = []
        self.ended: list[str] = []

    def handle(self, message: Message) -> None:
        on_loop_thread = threading.current_thread() is threading.main_thread()
        self.calls.append((message.fields["n"], message.attempt, on_loop_thread))
        if message.fields["n"] == "bad":
            raise ValueError("bad entry")
        if message.fields["n"] == "slow" and message.attempt == 1:
            time.sleep(0.6)  # past handler_timeout_s: the attempt fails

    async def on_stream_end(self, stream: str) -> None:
        self.ended.append(stream)


async def _produce(redis: AsyncRedis, service: str, stream: str, ns: list[str]) -> None:
    producer = Producer(redis, service=service)
    await producer.add_stream(stream)
    for n in ns:
        await producer.append(stream, {"n": n})
    await producer.close_stream(stream)


async def test_a_plain_handler_runs_in_a_thread_with_retries_and_dead_letters(
    redis: AsyncRedis, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    stream = f"d:{uid}"
    await _produce(redis, service, stream, ["0", "bad", "1", "slow", "2"])
    config = dataclasses.replace(FAST, max_handler_attempts=3)
    c = consumer_factory(Blocking, config=config)
    async with c:

        async def ended() -> bool:
            return c.ended == [stream]

        await eventually(ended)
    assert all(not on_loop for _, _, on_loop in c.calls), "handle() ran on the event loop"
    # "bad" fails three times, its side effects run three times (not more), then it is
    # dead-lettered and the stream goes on, in order.
    assert [(n, a) for n, a, _ in c.calls if n != "slow"] == [
        ("0", 1),
        ("bad", 1),
        ("bad", 2),
        ("bad", 3),
        ("1", 1),
        ("2", 1),
    ]
    [(_, fields)] = list(await redis.xrange(Keys(service).dead_letters) or [])
    letter = parse_dead_letter("x-0", {k.decode(): v.decode() for k, v in fields.items()})
    assert letter.fields["n"] == "bad"
    assert letter.attempts == 3
    assert "ValueError: bad entry" in letter.error


async def test_a_plain_handler_past_its_timeout_is_a_failed_attempt(
    redis: AsyncRedis, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    stream = f"d:{uid}"
    await _produce(redis, service, stream, ["slow", "after"])
    config = dataclasses.replace(FAST, handler_timeout_s=0.2)
    c = consumer_factory(Blocking, config=config)
    async with c:

        async def ended() -> bool:
            return c.ended == [stream]

        await eventually(ended)
    assert [(n, a) for n, a, _ in c.calls] == [("slow", 1), ("slow", 2), ("after", 1)]
    assert await redis.xlen(Keys(service).dead_letters) == 0


def test_a_generator_handler_is_refused_when_the_class_is_defined() -> None:
    with pytest.raises(ConfigurationError) as info:

        class Yields(StreamConsumer):
            async def handle(self, message: Message) -> AsyncIterator[None]:  # type: ignore[override]
                yield None

    assert info.value.field == "handle"
    assert "Yields.handle is an async generator function" in str(info.value)
    assert "\n" not in str(info.value)
