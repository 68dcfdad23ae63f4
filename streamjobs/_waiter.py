"""Idle waiting, multiplexed: a few blocking reads for all idle streams of a consumer.

On a standalone server (``ClusterMode.NONE``) a stream that has nothing to read does
not block a connection of its own. It registers here, with one of a few shards (one
per ``SHARD_STREAMS`` streams the consumer may own, at most ``MAX_SHARDS``), and each
shard's background task holds a single ``XREAD BLOCK`` over its registered streams
(``COUNT 1``, after the last id each stream has seen) on one dedicated connection;
when it returns, the streams that got entries are woken and run their own fenced
reads. A stream that registers while its shard's read is blocked ends it early with
``CLIENT UNBLOCK`` from another connection, so the next read includes it.
Connections per consumer grow with the shards, not with its idle streams
(docs/design.md#ownership).

Correctness never depends on this task: a waiting stream wakes up by itself after
its timeout and reads again, so a broken waiter costs latency, not entries. While
the waiter works, that timeout is long (``IDLE_RECHECK_S``); while it fails, streams
fall back to ``read_block_ms``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
import zlib
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
import anyio.abc

from ._guard import LoopGuard
from ._redis._admin import BlockingReader
from ._redis._protocol import StreamGateway
from .exceptions import RedisCommandError
from .metrics import MetricsRecorder

log = logging.getLogger(__name__)

IDLE_RECHECK_S = 300.0
"""How often, at most, an idle stream reads again by itself while the waiter works:
after a uniformly random ``0.5`` to ``1`` times this, so that thousands of streams
acquired together do not re-read together. It is a safety net only: the waiter reads
from each stream's last-delivered id, so an entry appended while its connection was
down is still returned by the next read. At 10,000 idle streams it costs about 350
commands/s (a fenced read is 8 commands); see benchmarks/README.md, idle cost."""

SHARD_STREAMS = 1250
"""Idle streams per blocking read, about (see :class:`Waiter`)."""
MAX_SHARDS = 16
"""The most blocking reads (connections) one consumer holds for idle streams."""

VANISHED_CHECK_S = 2.0
"""How often, at most, a shard checks that its waiting streams still exist (one
``EXISTS`` over all of them, after a read returns). A stream deleted while owned and
idle is woken, and its fenced read ends it as ``vanished``: within about
``read_block_ms`` plus this, not at its next re-read minutes later."""

_UNBLOCK_DEBOUNCE_S = 0.002
"""Registrations arriving together are added to the next read with one unblock."""


def shard_count(streams: int) -> int:
    """Blocking reads (connections) the idle wait of a consumer that may own
    ``streams`` streams holds: one per ``SHARD_STREAMS``, at least 1, at most
    ``MAX_SHARDS``."""
    return min(MAX_SHARDS, max(1, -(-streams // SHARD_STREAMS)))


@dataclass(slots=True, eq=False)
class Wait:
    """One stream's wait, in either shared idle wait (this one, ``_cluster_waiter``)."""

    after_id: str
    woken: asyncio.Future[None]
    """Resolved when the stream has entries, its timer ran out or its owner ends the
    wait: a bare future, since every idle stream holds one (an ``anyio.Event`` costs
    about 0.9 KiB, a future 0.15 KiB)."""
    node: str = ""
    """On a cluster: the primary whose subscription it waits on (by node name)."""

    def wake(self) -> None:
        if not self.woken.done():
            self.woken.set_result(None)


W = TypeVar("W", bound=Wait)


def register(waiting: dict[str, W], stream: str, entry: W) -> None:
    """Make ``entry`` the wait of ``stream``. Two waits on one name (a stale owner of
    an earlier job, not yet told): the earlier one reads again rather than sleep out
    its timer."""
    displaced = waiting.get(stream)
    if displaced is not None:
        displaced.wake()
    waiting[stream] = entry


async def until_woken(entry: Wait, timeout_s: float) -> None:
    """Wait until ``entry`` is woken, ``timeout_s`` at the latest: a timer, not a
    cancel scope, since every idle stream holds one (0.1 KiB, not 0.6)."""
    loop = asyncio.get_running_loop()
    timer = None if math.isinf(timeout_s) else loop.call_later(timeout_s, entry.wake)
    try:
        await entry.woken
    finally:
        if timer is not None:
            timer.cancel()


class _Shard:
    """One blocking read over the idle streams that hash to it.

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
        self._waiting: dict[str, Wait] = {}
        self._generation = 0  # bumped by every registration
        self._reading: int | None = None  # generation of the read in flight
        self._client_id: int | None = None
        self._changed = anyio.Event()
        self._nudged = anyio.Event()
        self._last_read_ok = 0.0
        self._checked_at = 0.0  # monotonic: the last check for deleted streams

    @property
    def healthy(self) -> bool:
        """A read finished recently: registered streams will be woken."""
        return time.monotonic() - self._last_read_ok < self._block_ms / 1000 + 5.0

    async def wait(
        self,
        stream: str,
        after_id: str,
        timeout_s: float,
        woken: asyncio.Future[None] | None = None,
    ) -> None:
        """Return once ``stream`` has an entry newer than ``after_id`` (as far as the
        waiter knows), after ``timeout_s``, or once ``woken`` is resolved."""
        if woken is None:
            woken = asyncio.get_running_loop().create_future()
        entry = Wait(after_id, woken)
        register(self._waiting, stream, entry)
        self._generation += 1
        self._nudge()
        try:
            await until_woken(entry, timeout_s)
        finally:
            if self._waiting.get(stream) is entry:
                del self._waiting[stream]

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
                except RedisCommandError:
                    # The server refused the read (a key among them that is no stream
                    # any more, WRONGTYPE, fails all of it): every stream reads by itself
                    # once, so the one at fault meets the error where it ends its
                    # assignment, instead of all waiting out their idle re-check.
                    for waiting in list(self._waiting.values()):
                        waiting.wake()
                    raise
                finally:
                    self._reading = None
                self._last_read_ok = time.monotonic()
                if self._last_read_ok - self._checked_at >= VANISHED_CHECK_S:
                    self._checked_at = self._last_read_ok
                    ready = [*ready, *await reader.missing(list(self._waiting))]
                for stream in ready:
                    entry = self._waiting.get(stream)
                    if entry is not None:
                        entry.wake()
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
                    if await self._gw.liveness.unblock(client_id):
                        break
                except Exception as exc:
                    log.debug("CLIENT UNBLOCK failed (%s): the read ends by itself", exc)
                    break
                await anyio.sleep(0.001)  # the read is still on its way to the server


class Waiter:
    """The multiplexed idle wait of one consumer (standalone servers).

    Idle streams are spread over ``shards`` blocking reads (one connection each) by a
    hash of their names. Every registration re-sends the names of its shard's waiting
    streams, so a shard holds at most about ``SHARD_STREAMS`` of them: at 10,000 idle
    streams a wake-up re-sends 1,250 names, not 10,000 (benchmarks/README.md, idle
    cost).

    Args:
        client: the user's ``redis.asyncio.Redis``; one of its pool's connections is
            held per shard for the blocking read.
        gateway: for ``CLIENT UNBLOCK``.
        block_ms: longest single blocking read.
        streams: the most streams that may wait at once (``max_concurrent_streams``):
            sizes the number of shards.
    """

    def __init__(
        self,
        client: Any,
        gateway: StreamGateway,
        *,
        block_ms: int,
        metrics: MetricsRecorder,
        service: str,
        streams: int = 1,
    ) -> None:
        count = shard_count(streams)
        self._shards = [
            _Shard(client, gateway, block_ms=block_ms, metrics=metrics, service=service)
            for _ in range(count)
        ]

    @property
    def usable(self) -> bool:
        """Streams may wait here (always: a failing shard shortens their timeouts)."""
        return True

    @property
    def shards(self) -> int:
        return len(self._shards)

    def _shard(self, stream: str) -> _Shard:
        return self._shards[zlib.crc32(stream.encode()) % len(self._shards)]

    async def wait(
        self,
        stream: str,
        after_id: str,
        timeout_s: float,
        woken: asyncio.Future[None] | None = None,
    ) -> None:
        """Return once ``stream`` has an entry newer than ``after_id`` (as far as the
        waiter knows), after ``timeout_s``, or once ``woken`` is resolved: what its
        owner resolves to end the wait early (shutdown, finish, a loss). The future
        is the wait's own, so another wait on the same name is never woken by it."""
        await self._shard(stream).wait(stream, after_id, timeout_s, woken)

    def idle_timeout_s(self, stream: str, fallback_s: float) -> float:
        """How long ``stream`` may wait here before reading again by itself."""
        if self._shard(stream).healthy:
            return IDLE_RECHECK_S * random.uniform(0.5, 1.0)
        return fallback_s

    async def run(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        async with anyio.create_task_group() as tg:
            for shard in self._shards:
                await tg.start(shard.run)
            task_status.started()
