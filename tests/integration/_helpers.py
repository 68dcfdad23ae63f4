"""Shared helpers of the integration tests: a recording consumer, polling, a SESSION
configuration, and what a service holds in Redis."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import anyio
from redis.asyncio import Redis as AsyncRedis

from streamjobs import ConsumerConfig, Liveness, Message, StreamConsumer
from streamjobs._deadletter import parse_dead_letter
from streamjobs._keys import Keys


async def eventually(
    check: Callable[[], Awaitable[bool]], *, timeout_s: float = 20.0, interval_s: float = 0.05
) -> None:
    """Poll ``check`` until it is true or fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        if await check():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s}s")
        await anyio.sleep(interval_s)


class Recorder(StreamConsumer):
    """Records (consumer, stream, id, field) of every handled entry, in order."""

    handled: list[tuple[str, str, str, str]]
    lost: list[str]
    started: list[str]
    ended: list[str]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.handled, self.lost, self.started, self.ended = [], [], [], []

    async def handle(self, message: Message) -> None:
        self.handled.append(
            (self.consumer_name, message.stream, message.id, message.fields.get("n", ""))
        )

    async def on_stream_start(self, stream: str, info: Mapping[str, Any]) -> None:
        self.started.append(stream)

    async def on_stream_end(self, stream: str) -> None:
        self.ended.append(stream)

    async def on_stream_lost(self, stream: str) -> None:
        self.lost.append(stream)


async def true(value: bool) -> bool:
    """``value``, awaitable: ``eventually(lambda: true(len(c.handled) == 3))``."""
    return value


SESSION = ConsumerConfig(
    lock_ttl_s=1.0, liveness=Liveness.SESSION, read_block_ms=100, max_concurrent_streams=20
)
"""``Liveness.SESSION`` with a 1 s lock TTL: a session (and a lock that names it) lives
the long session TTL, a lock cut short at completion lives 1 s."""


def decoded(fields: dict[bytes, bytes]) -> dict[str, str]:
    return {k.decode(): v.decode("utf-8", "replace") for k, v in fields.items()}


async def dead_letters(redis: AsyncRedis, service: str) -> list[Any]:
    """The service's dead letters, parsed."""
    return [
        parse_dead_letter(i.decode(), decoded(f))
        for i, f in await redis.xrange(Keys(service).dead_letters)
    ]


async def assert_nothing_held(redis: AsyncRedis, service: str, streams: list[str]) -> None:
    """No lock of ``streams``, no assignment pending, no lease left."""
    keys = Keys(service)
    for s in streams:
        assert await redis.exists(keys.lock(s)) == 0, f"lock of {s} left behind"
    assert (await redis.xpending(keys.assignments, service))["pending"] == 0
    assert await redis.zcard(keys.leases) == 0
