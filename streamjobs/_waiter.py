"""Idle waiting, multiplexed: one blocking read for all idle streams of a consumer.

On a standalone server (``ClusterMode.NONE``) a stream that has nothing to read does
not block a connection of its own. It registers here, and one background task holds
a single ``XREAD BLOCK`` over every registered stream (``COUNT 1``, after the last id
each stream has seen) on one dedicated connection; when it returns, the streams that
got entries are woken and run their own fenced reads. A stream that registers while
that read is blocked ends it early with ``CLIENT UNBLOCK`` from another connection,
so the next read includes it. Connections per consumer no longer grow with its idle
streams (docs/design.md#ownership).

Correctness never depends on this task: a waiting stream wakes up by itself after
its timeout and reads again, so a broken waiter costs latency, not entries. While
the waiter works, that timeout is long (``IDLE_RECHECK_S``); while it fails, streams
fall back to ``read_block_ms``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc

from ._guard import LoopGuard
from ._redis import BlockingReader, StreamGateway
from .metrics import MetricsRecorder

log = logging.getLogger(__name__)

IDLE_RECHECK_S = 30.0
"""How often an idle stream reads again by itself while the waiter works (a safety
net: a wake-up can only be missed if the waiter lost its connection)."""

_UNBLOCK_DEBOUNCE_S = 0.002
"""Registrations arriving together are added to the next read with one unblock."""


@dataclass(slots=True, eq=False)
class _Wait:
    after_id: str
    woken: anyio.Event = field(default_factory=anyio.Event)


class Waiter:
    """The multiplexed idle wait of one consumer (standalone servers).

    Args:
        client: the user's ``redis.asyncio.Redis``; one of its pool's connections is
            held for the blocking read.
        gateway: for ``CLIENT UNBLOCK``.
        block_ms: longest single blocking read.
    """

    def __init__(
        self,
        client: Any,
        gateway: StreamGateway,
        *,
        block_ms: int,
        metrics: MetricsRecorder,
        service: str,
    ) -> None:
        self._client = client
        self._gw = gateway
        self._block_ms = block_ms
        self._metrics = metrics
        self._service = service
        self._waiting: dict[str, _Wait] = {}
        self._generation = 0  # bumped by every registration
        self._reading: int | None = None  # generation of the read in flight
        self._client_id: int | None = None
        self._changed = anyio.Event()
        self._nudged = anyio.Event()
        self._last_read_ok = 0.0

    @property
    def healthy(self) -> bool:
        """A read finished recently: registered streams will be woken."""
        return time.monotonic() - self._last_read_ok < self._block_ms / 1000 + 5.0

    async def wait(self, stream: str, after_id: str, timeout_s: float) -> None:
        """Return once ``stream`` has an entry newer than ``after_id`` (as far as the
        waiter knows), or after ``timeout_s``."""
        entry = _Wait(after_id)
        self._waiting[stream] = entry
        self._generation += 1
        self._nudge()
        try:
            with anyio.move_on_after(timeout_s):
                await entry.woken.wait()
        finally:
            if self._waiting.get(stream) is entry:
                del self._waiting[stream]

    def idle_timeout_s(self, fallback_s: float) -> float:
        """How long a stream may wait here before reading again by itself."""
        return IDLE_RECHECK_S if self.healthy else fallback_s

    def _nudge(self) -> None:
        changed, self._changed = self._changed, anyio.Event()
        changed.set()
        self._nudged.set()

    async def run(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._unblocker)
            task_status.started()
            guard = LoopGuard("waiter", self._service, self._metrics, log)
            while True:
                try:
                    await self._serve()
                except Exception as exc:
                    await guard.failed(exc, "waiting for entries")

    async def _serve(self) -> None:
        reader = BlockingReader(self._client)
        try:
            await reader.open()
            self._client_id = reader.client_id
            while True:
                if not self._waiting:
                    self._last_read_ok = time.monotonic()
                    changed = self._changed
                    with anyio.move_on_after(self._block_ms / 1000):
                        await changed.wait()
                    continue
                snapshot = {s: w.after_id for s, w in self._waiting.items()}
                self._reading = self._generation
                try:
                    ready = await reader.read(snapshot, self._block_ms)
                finally:
                    self._reading = None
                self._last_read_ok = time.monotonic()
                for stream in ready:
                    entry = self._waiting.get(stream)
                    if entry is not None:
                        entry.woken.set()
        finally:
            self._client_id = None
            await reader.close()

    async def _unblocker(self) -> None:
        """End a blocking read that misses streams registered after it started."""
        while True:
            await self._nudged.wait()
            self._nudged = anyio.Event()
            await anyio.sleep(_UNBLOCK_DEBOUNCE_S)
            deadline = time.monotonic() + self._block_ms / 1000
            while time.monotonic() < deadline:
                reading, client_id = self._reading, self._client_id
                if reading is None or reading >= self._generation or client_id is None:
                    break  # no read in flight, or it already includes everybody
                try:
                    if await self._gw.unblock(client_id):
                        break
                except Exception as exc:
                    log.debug("CLIENT UNBLOCK failed (%s): the read ends by itself", exc)
                    break
                await anyio.sleep(0.001)  # the read is still on its way to the server
