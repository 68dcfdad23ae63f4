"""Shared helpers of the integration tests: a recording consumer and polling."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import anyio

from streamjobs import Message, StreamConsumer


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
