"""A runtime's intake: reading assignments into free slots, one stream task each,
and dead-lettering an assignment it cannot parse."""

from __future__ import annotations

import asyncio
import contextlib

import anyio
import anyio.abc

from ._guard import LoopGuard, log_failure
from ._ownership import CLEANUP_TIMEOUT_S, OwnedStream
from ._redis import REDIS_FAILURES, RawFields
from ._runtime_liveness import RuntimeLiveness
from ._runtime_state import (
    log,
)
from ._wire import parse_assignment
from .exceptions import (
    InvalidAssignment,
    NoSuchGroup,
)


class RuntimeIntake(RuntimeLiveness):
    """Taking assignments and starting their streams."""

    def _wake_intake(self) -> None:
        self._slot_freed.set()
        self._slot_freed = anyio.Event()

    async def _stream_task(self, stream: OwnedStream) -> None:
        try:
            await stream.run()
        except Exception:
            # A bug, not a Redis failure (those are handled inside): the stream already
            # settled (handed back or left to recovery); the consumer carries on.
            self.metrics.loop_error(self.service, "stream")
            log.exception(
                "stream %r: unexpected error; it was given up",
                stream.stream,
                extra=stream.log_extra(),
            )
        finally:
            self._streams.discard(stream)
            self._wake_intake()
            if not self._streams:
                self._all_done.set()

    def _start_stream(self, stream: OwnedStream) -> None:
        """Run ``stream`` in a task of its own: a plain asyncio task, not one of an
        anyio task group, whose per-task bookkeeping cost about 2 KiB per idle stream.
        Nothing escapes it but cancellation (see ``_stream_task``), and it is ended
        through the stream's own cancel scope (``_stop_streams``)."""
        assert self._streams_tg is not None
        if self._all_done.is_set():
            self._all_done = anyio.Event()
        self._streams.add(stream)
        task = asyncio.get_running_loop().create_task(self._stream_task(stream))
        self._stream_tasks.add(task)
        task.add_done_callback(self._stream_tasks.discard)

    async def _stop_streams(self) -> None:
        """Cancel every stream (each still hands its assignment back) and wait until
        their tasks ended. Shielded: it runs when ``run()`` is cancelled."""
        with anyio.CancelScope(shield=True):
            # Again while a stream was started meanwhile (by an intake read that ended
            # as run() was cancelled).
            while running := [t for t in self._stream_tasks if not t.done()]:
                for stream in list(self._streams):
                    stream.cancel()
                await asyncio.wait(running)

    async def _intake_loop(self) -> None:
        guard = LoopGuard("intake", self.service, self.metrics, log)
        try:
            while not self._draining:
                if self.session_mode and not self._session_live():
                    await self._wait_for_session()
                    continue
                free = self.config.max_concurrent_streams - len(self._streams)
                if free <= 0:
                    await self._slot_freed.wait()
                    continue
                try:
                    batch = await self._read_assignments(free)
                except Exception as exc:
                    if isinstance(exc, NoSuchGroup):  # the LBS or its group was deleted
                        self._group_missing = True
                        with contextlib.suppress(*REDIS_FAILURES):
                            await self.gateway.ensure_group()
                    await guard.failed(exc, "intake")
                    continue
                self._group_missing = False
                guard.ok()
                await self._take(batch)
        finally:
            self._intake_done.set()

    async def _read_assignments(self, count: int) -> list[tuple[str, RawFields]]:
        """XREADGROUP, shielded: once the server answered, the reply must be acted on.

        A cancelled read whose reply was already sent would leave the delivered
        assignments pending without a lock, costing a retry and ``min_idle_s``. The
        read blocks at most ``read_block_ms``; the bound beyond it covers a dead socket.
        """
        block_ms = self.config.read_block_ms
        with (
            anyio.CancelScope(shield=True),
            anyio.move_on_after(block_ms / 1000 + CLEANUP_TIMEOUT_S),
        ):
            return await self.gateway.read_assignments(self.name, count, block_ms)
        return []

    async def _take(self, batch: list[tuple[str, RawFields]]) -> None:
        """Start a stream task per parsed assignment; dead-letter the unparseable ones.

        Streams are started without an await in between, so even under cancellation
        each assignment gets its task, whose clean-up hands it back.
        """
        bad: list[tuple[str, RawFields, InvalidAssignment]] = []
        for entry_id, fields in batch:
            try:
                assignment = parse_assignment(entry_id, fields, self.gateway.keys)
            except InvalidAssignment as exc:
                bad.append((entry_id, fields, exc))
                continue
            self._start_stream(OwnedStream(self, assignment))
        for entry_id, fields, why in bad:
            await self._dead_letter_unparseable(entry_id, fields, why)

    async def _dead_letter_unparseable(
        self, entry_id: str, fields: RawFields, exc: InvalidAssignment
    ) -> None:
        log.warning(
            "assignment %s is unparseable (%.600s): dead-lettering it",
            entry_id,
            exc,
            extra={"service": self.service, "consumer": self.name, "assignment_id": entry_id},
        )
        try:
            await self.recoverer.dead_letter_unparseable(entry_id, fields, exc, owner=self.name)
        except Exception as failure:
            # Still pending with no lock: the reconciliation scan dead-letters it later.
            self.metrics.loop_error(self.service, "intake")
            log_failure(log, f"dead-lettering assignment {entry_id}", failure, 0.0)
