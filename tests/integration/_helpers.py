"""Shared helpers of the integration tests: a recording consumer and polling."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import anyio
from redis.asyncio.cluster import RedisCluster

from streamjobs import ClusterMode, Message, StreamConsumer


def mode(client: Any) -> ClusterMode:
    """The cluster mode that goes with a test client."""
    return ClusterMode.OSS if isinstance(client, RedisCluster) else ClusterMode.NONE


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

    def _init_lists(self) -> None:
        if not hasattr(self, "handled"):
            self.handled, self.lost, self.started, self.ended = [], [], [], []

    async def handle(self, message: Message) -> None:
        self._init_lists()
        self.handled.append(
            (self.consumer_name, message.stream, message.id, message.fields.get("n", ""))
        )

    async def on_stream_start(self, stream: str, info: Mapping[str, Any]) -> None:
        self._init_lists()
        self.started.append(stream)

    async def on_stream_end(self, stream: str) -> None:
        self._init_lists()
        self.ended.append(stream)

    async def on_stream_lost(self, stream: str) -> None:
        self._init_lists()
        self.lost.append(stream)
