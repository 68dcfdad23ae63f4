"""A consumer's intake: reading assignments into free slots, one stream task each,
and dead-lettering an assignment it cannot parse. :class:`Intake` is held by the
runtime."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from typing import Any

import anyio
import anyio.abc

from ._guard import LoopGuard, log_failure
from ._ownership import OwnedStream
from ._redis._boundary import REDIS_FAILURES
from ._redis._replies import RawFields
from ._runtime_liveness import Heartbeat, log
from ._stream_state import CLEANUP_TIMEOUT_S, Host
from ._wire import parse_assignment
from .exceptions import (
    InvalidAssignment,
    NoSuchGroup,
)


class Intake:
    """Taking assignments and running their streams, one task each (the runtime holds
    one). Nothing escapes a stream's task but cancellation.

    Args:
        host: the runtime, which every stream sees as its ``Host``.
        heartbeat: under ``Liveness.SESSION`` nothing is taken without a live session.

    Attributes:
        streams: the streams acquiring, owned, or being handed back.
        all_done: set while no stream runs.
        done: set once the intake loop ended (shutdown).
        group_missing: the last read found no consumer group (readiness).
    """

    def __init__(self, host: Host, heartbeat: Heartbeat) -> None:
        self.host = host
        self.heartbeat = heartbeat
        self.streams: set[OwnedStream] = set()
        self.all_done = anyio.Event()
        self.all_done.set()
        self.done = anyio.Event()
        self.group_missing = False
        self._slot_freed = anyio.Event()
        self._tasks: set[asyncio.Task[None]] = set()  # see start_stream
        self._tg: anyio.abc.TaskGroup | None = None

    def reset(self) -> None:
        """A new run: its intake has not ended."""
        self.done = anyio.Event()

    def spawn(self, fn: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run ``fn`` in the background, outliving the stream that asks (``Host.spawn``)."""
        assert self._tg is not None
        self._tg.start_soon(fn)

    async def host_streams(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        """Hold the task group of what streams spawn; at its end, stop every stream."""
        async with anyio.create_task_group() as tg:
            self._tg = tg
            task_status.started()
            try:
                await anyio.sleep_forever()
            finally:
                await self._stop_streams()

    def wake(self) -> None:
        self._slot_freed.set()
        self._slot_freed = anyio.Event()

    async def _stream_task(self, stream: OwnedStream) -> None:
        try:
            await stream.run()
        except Exception:
            # A bug, not a Redis failure (those are handled inside): the stream already
            # settled (handed back or left to recovery); the consumer carries on.
            self.host.metrics.loop_error(self.host.service, "stream")
            log.exception(
                "stream %r: unexpected error; it was given up",
                stream.stream,
                extra=stream.log_extra(),
            )
        finally:
            self.streams.discard(stream)
            self.wake()
            if not self.streams:
                self.all_done.set()

    def start_stream(self, stream: OwnedStream) -> None:
        """Run ``stream`` in a task of its own: a plain asyncio task, not one of an
        anyio task group, whose per-task bookkeeping cost about 2 KiB per idle stream.
        Nothing escapes it but cancellation (see ``_stream_task``), and it is ended
        through the stream's own cancel scope (``_stop_streams``)."""
        assert self._tg is not None
        if self.all_done.is_set():
            self.all_done = anyio.Event()
        self.streams.add(stream)
        task = asyncio.get_running_loop().create_task(self._stream_task(stream))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _stop_streams(self) -> None:
        """Cancel every stream (each still hands its assignment back) and wait until
        their tasks ended. Shielded: it runs when ``run()`` is cancelled."""
        with anyio.CancelScope(shield=True):
            # Again while a stream was started meanwhile (by an intake read that ended
            # as run() was cancelled).
            while running := [t for t in self._tasks if not t.done()]:
                for stream in list(self.streams):
                    stream.cancel()
                await asyncio.wait(running)

    async def loop(self) -> None:
        guard = LoopGuard("intake", self.host.service, self.host.metrics, log)
        try:
            while not self.host.draining:
                if self.heartbeat.session_mode and not self.heartbeat.session_live():
                    await self.heartbeat.wait_for_session()
                    continue
                free = self.host.config.max_concurrent_streams - len(self.streams)
                if free <= 0:
                    await self._slot_freed.wait()
                    continue
                try:
                    batch = await self._read_assignments(free)
                except Exception as exc:
                    if isinstance(exc, NoSuchGroup):  # the LBS or its group was deleted
                        self.group_missing = True
                        with contextlib.suppress(*REDIS_FAILURES):
                            await self.host.gateway.assignments.ensure_group()
                    await guard.failed(exc, "intake")
                    continue
                self.group_missing = False
                guard.ok()
                await self._take(batch)
        finally:
            self.done.set()

    async def _read_assignments(self, count: int) -> list[tuple[str, RawFields]]:
        """XREADGROUP, shielded: once the server answered, the reply must be acted on.

        A cancelled read whose reply was already sent would leave the delivered
        assignments pending without a lock, costing a retry and ``min_idle_s``. The
        read blocks at most ``read_block_ms``; the bound beyond it covers a dead socket.
        """
        block_ms = self.host.config.read_block_ms
        with (
            anyio.CancelScope(shield=True),
            anyio.move_on_after(block_ms / 1000 + CLEANUP_TIMEOUT_S),
        ):
            return await self.host.gateway.assignments.read_assignments(
                self.host.name, count, block_ms
            )
        return []

    async def _take(self, batch: list[tuple[str, RawFields]]) -> None:
        """Start a stream task per parsed assignment; dead-letter the unparseable ones.

        Streams are started without an await in between, so even under cancellation
        each assignment gets its task, whose clean-up hands it back.
        """
        bad: list[tuple[str, RawFields, InvalidAssignment]] = []
        for entry_id, fields in batch:
            try:
                assignment = parse_assignment(entry_id, fields, self.host.gateway.keys)
            except InvalidAssignment as exc:
                bad.append((entry_id, fields, exc))
                continue
            self.start_stream(OwnedStream(self.host, assignment))
        for entry_id, fields, why in bad:
            await self._dead_letter_unparseable(entry_id, fields, why)

    async def _dead_letter_unparseable(
        self, entry_id: str, fields: RawFields, exc: InvalidAssignment
    ) -> None:
        host = self.host
        log.warning(
            "assignment %s is unparseable (%.600s): dead-lettering it",
            entry_id,
            exc,
            extra={
                "service": host.service,
                "consumer": host.name,
                "assignment_id": entry_id,
            },
        )
        try:
            await host.recoverer.dead_letter_unparseable(entry_id, fields, exc, owner=host.name)
        except Exception as failure:
            # Still pending with no lock: the reconciliation scan dead-letters it later.
            host.metrics.loop_error(host.service, "intake")
            log_failure(log, f"dead-lettering assignment {entry_id}", failure, 0.0)
