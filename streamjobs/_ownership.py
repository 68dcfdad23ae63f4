"""The life of one owned stream (docs/design.md#ownership).

:class:`OwnedStream` takes an assignment from acquisition to its end:

1. acquire the stream's lock with a token unique to this acquisition;
2. loop: one fenced script call acks the previous batch and reads the next (pending
   entries of a previous owner first); hand each entry to ``handle()`` in order while
   the local lease is valid; wait with a plain ``XREAD BLOCK`` when idle;
3. a failing entry is retried or dead-lettered by the entry pipeline (``_pipeline``);
4. end in exactly one way: finished (end marker or ``finish()``: complete the
   assignment, THEN release the lock), lost (the lock expired or was taken over:
   stop, ack nothing more, report it), or handed back (shutdown, cancellation, or
   a lock someone else holds: re-queue without counting a retry, then unlock).

The hand-back runs shielded from cancellation and bounded in time, whatever ended
the stream, so a cancelled consumer leaves no lock or lease of its own behind.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Mapping
from typing import Any

import anyio
import anyio.to_thread

from ._backoff import Backoff
from ._deadletter import Pairs, entry_dead_letter
from ._guard import log_failure
from ._pipeline import Failed
from ._redis._replies import DataEntry, text_fields
from ._stream_acquire import Acquisition
from ._stream_end import StreamEnd
from ._stream_state import (
    CLEANUP_TIMEOUT_S,
    PERMANENT,
    Host,
    Outcome,
    OwnedStreamState,
)
from ._wire import (
    CANCEL_FIELD,
    EOS_FIELD,
    EOS_VALUE,
    REPLAY_END_FIELD,
    REPLAYED_FROM_FIELD,
    Assignment,
    is_eos,
)
from .exceptions import (
    NoSuchGroup,
)

_EOS_TEXT: tuple[str | bytes, str | bytes] = (EOS_FIELD, EOS_VALUE)
_EOS_BYTES: tuple[str | bytes, str | bytes] = (EOS_FIELD.encode(), EOS_VALUE.encode())
_RUN_FIELDS = (
    REPLAYED_FROM_FIELD,
    REPLAY_END_FIELD,
    REPLAYED_FROM_FIELD.encode(),
    REPLAY_END_FIELD.encode(),
)
"""The fields that mark a DLQ replay's own entries, in either mode (see _run_entries)."""

__all__ = ["CLEANUP_TIMEOUT_S", "OwnedStream"]


class OwnedStream:
    """One assignment, from acquiring its stream's lock to finishing or giving it up;
    its seat in the entry pipeline (``_pipeline.Seat``) hands entries while the lock
    is ours and acknowledges them with the next fenced read.

    It holds the stream's state (``s``, what the runtime and its loops act on), its
    acquisition and its terminal paths (``end``)."""

    loop = "stream"
    ack_interval_s: float | None = None
    last_flush = 0.0

    def __init__(self, host: Host, assignment: Assignment) -> None:
        self.s = OwnedStreamState(host, assignment)
        self.clear = self.s.clear  # (the pipeline's hot check: one call, no hop)
        self.acquisition = Acquisition(self.s)
        self.end = StreamEnd(self.s)

    # -- what the runtime's intake calls ------------------------------------------------

    @property
    def stream(self) -> str:
        return self.s.assignment.stream

    @property
    def handling(self) -> bool:
        """In a batch of ``handle()`` calls (statistics)."""
        return self.s.handling

    def interrupt(self) -> None:
        self.s.interrupt()

    def cancel(self) -> None:
        self.s.cancel()

    def log_extra(self) -> dict[str, str]:
        return self.s.log_extra()

    # -- the life ----------------------------------------------------------------------

    async def run(self) -> None:
        outcome = Outcome.STOPPED
        try:
            with self.s.scope:
                if await self.acquisition.acquire():
                    outcome = await self._process()
                elif self.s.unusable is not None:
                    outcome = await self.end.dead_letter_assignment(self.s.unusable)
                elif self.s.contended:
                    outcome = await self.end.give_back_contended()
                elif self.s.stale:
                    outcome = Outcome.SETTLED
        finally:
            with anyio.CancelScope(shield=True):
                await self.end.settle(outcome)

    async def _process(self) -> Outcome:
        """Hand the stream's entries to ``handle()`` until it ends, is lost or we stop."""
        host = self.s.host
        stream = self.s.stream
        begun = False  # on_stream_start called
        backoff = Backoff()
        count = self.s.first_count()
        # The largest entry of this stream's last batch: a read whose entries may be
        # large goes on a connection of its own (docs/design.md#the-command-channel).
        # Unknown before the first batch: a stream's first reads take the channel.
        entry_bytes = 0
        idle_timeout_s = host.config.stream_idle_timeout_s
        # The end marker's field as the entries hold it: bytes in bytes mode.
        eos_field, eos_value = _EOS_BYTES if host.gateway.raw_fields else _EOS_TEXT
        active_at = time.monotonic()  # last time an entry (or the acquisition) came
        claim = False  # the last read returned pending entries: claim before reading new
        if self.s.job_ended:
            return await self.end.complete_silently()
        while True:
            if self.s.lost:
                return Outcome.LOST
            if host.draining:
                return Outcome.STOPPED
            if self.s.finish_requested:
                return await self.end.finish()
            first, self.s.first_read = self.s.first_read, None
            if first is not None:  # read with the acquisition
                reply, sent = first, self.s.lock_extended_at
            else:
                if time.monotonic() >= self.s.lease_deadline and not await self._lease_valid():
                    # Past the lease (a pause): no read until the heartbeat has renewed
                    # it. A read behind a fence that fails still takes entries (stray.lua).
                    continue
                sent = time.monotonic()
                try:
                    reply = await host.gateway.streams.fenced_read(
                        stream,
                        self.s.token,
                        host.name,
                        count,
                        self.s.to_ack,
                        claim=claim,
                        reply_bytes=count * entry_bytes,
                    )
                except NoSuchGroup as exc:
                    return await self.end.vanished(exc)
                except PERMANENT as exc:
                    return await self.end.dead_letter_assignment(exc)
                except Exception as exc:
                    claim = True  # a read whose reply was lost left entries pending with us
                    host.metrics.loop_error(host.service, "stream")
                    delay = backoff.next_delay()
                    log_failure(self.s.log, f"stream {stream!r}", exc, delay)
                    await self.s.pause(delay)
                    continue
            backoff.reset()
            ok, top, batch = reply.owned, reply.top, reply.entries
            largest, claim = reply.largest_bytes, reply.claimed
            if not ok:
                self.s.mark_lost()
                return Outcome.LOST
            self.s.confirmed(sent)
            self.s.to_ack = []
            if reply.cancelled is not None:
                return await self.end.cancelled(reply.cancelled)
            if batch:
                count = self._next_count(largest)
                entry_bytes = largest
                if self.s.assignment.run:
                    batch = self._run_entries(batch)
            if not begun:
                if not batch and await self.end.already_finished(top):
                    return await self.end.complete_silently()
                if time.monotonic() >= self.s.check_at and not await self._lease_valid():
                    # The reply was acted on late (a pause after the read): the stream
                    # may be someone else's now. What it delivered stays pending with
                    # us, and the next read claims it, if the stream is still ours.
                    continue
                begun = True
                try:
                    await host.hooks.on_stream_start(stream, self.s.assignment.info)
                except Exception:
                    self.s.log.exception("on_stream_start(%r) raised; continuing", stream)
            if not batch:
                idle_left_s = math.inf
                if idle_timeout_s is not None:
                    idle_left_s = idle_timeout_s - (time.monotonic() - active_at)
                    if idle_left_s <= 0:
                        return await self.end.abandon(idle_timeout_s)
                await self._wait_for_entries(top, idle_left_s)
                continue
            active_at = time.monotonic()
            entries, end = _split_at_end(batch, eos_field, eos_value)
            self.s.handling = True
            try:
                done = await host.pipeline.handle_batch(self, entries)
            finally:
                self.s.handling = False
            if end is not None and done == len(entries):
                marker = text_fields(end[1])
                if is_eos(marker):
                    self.s.eos_ids = [end[0]]
                    if CANCEL_FIELD in marker:
                        return await self.end.cancelled(marker[CANCEL_FIELD])
                return await self.end.finish()
            if self.s.finish_requested:
                return await self.end.finish()

    def _run_entries(self, batch: list[DataEntry]) -> list[DataEntry]:
        """What a DLQ replay's run hands over of ``batch``: its replayed copies and its
        replay's end marker. Anything else was appended to an ended job after its end
        (its producer did not know), between the run's queueing and its entries'
        placement: acked, never handled (docs/design.md#job-identity)."""
        own = []
        for entry_id, fields in batch:
            if any(name in fields for name in _RUN_FIELDS):
                own.append((entry_id, fields))
            else:
                self.s.to_ack.append(entry_id)
        return own

    def _next_count(self, largest_bytes: int) -> int:
        """Entries to read next, so that entries as large as the largest of the batch
        just read fit in ``read_batch_bytes`` (at least one: a larger entry is read
        alone). Also the consumer's hint for the first read of other streams."""
        self.s.host.entry_size_hint = largest_bytes
        return self.s.count_for(largest_bytes)

    async def _wait_for_entries(self, top: str, longest_s: float = math.inf) -> None:
        host = self.s.host
        waiter = host.waiter
        if waiter is not None and waiter.usable:
            # No cancel scope per idle stream (about 0.6 KiB each): what must end the
            # wait early (shutdown, finish(), a loss) resolves this wait's own future
            # (OwnedStreamState.end_wait). Nothing awaits between the check and the
            # registration, so no such call can fall between them.
            if self.s.stopping() or self.s.finish_requested:
                return
            fallback_s = host.config.read_block_ms / 1000
            timeout_s = min(longest_s, waiter.idle_timeout_s(self.s.stream, fallback_s))
            self.s.idle_wake = asyncio.get_running_loop().create_future()
            try:
                await waiter.wait(self.s.stream, top, timeout_s, self.s.idle_wake)
            except Exception as exc:
                await self._wait_failed(exc)
            finally:
                self.s.idle_wake = None
            return
        with anyio.CancelScope() as self.s.wait_scope:
            if self.s.stopping() or self.s.finish_requested:
                return
            try:
                await host.gateway.streams.wait_for_entries(
                    self.s.stream, top, host.config.read_block_ms
                )
            except Exception as exc:
                await self._wait_failed(exc)
        self.s.wait_scope = None

    async def _wait_failed(self, exc: Exception) -> None:
        host = self.s.host
        host.metrics.loop_error(host.service, "stream")
        delay = Backoff().next_delay()
        log_failure(self.s.log, f"stream {self.s.stream!r}: waiting for entries", exc, delay)
        await anyio.sleep(delay)

    async def _lease_valid(self) -> bool:
        """True if the next entry may be handed to ``handle()``.

        Past the lease deadline (a pause, or heartbeats failing) wait for the heartbeat
        to extend the lock or to find it lost; never hand an entry on an expired lease.
        Before it, but more than ``RECHECK_AFTER_S`` since the lock was last proved
        ours, read the lock: one that vanished or changed hands early is lost now, not
        at the next heartbeat.
        """
        while True:
            changed = self.s.state_changed()
            if self.s.stopping():
                return False
            now = time.monotonic()
            if now >= self.s.lease_deadline:
                await changed.wait()
                continue
            if now < self.s.check_at:
                return True
            return await self._recheck(now)

    async def _recheck(self, sent: float) -> bool:
        """Read the lock (and the cancel marker, in the same round trip): False if the
        stream was lost, or cancelled (the next fenced read then ends it, so a batch of
        slow entries is not handled to its end first)."""
        host = self.s.host
        try:
            holder, cancelled = await host.gateway.liveness.lock_and_cancel(self.s.stream)
        except Exception as exc:
            # Redis cannot say: the local lease still bounds the risk. Ask again later.
            host.metrics.loop_error(host.service, "stream")
            log_failure(self.s.log, f"stream {self.s.stream!r}: re-reading its lock", exc, 0.0)
            self.s.confirmed(sent)
            return not self.s.stopping()
        if holder != self.s.token:
            self.s.log.warning(
                "stream %r: its lock %s before its TTL (operator, eviction or a server "
                "clock step?)",
                self.s.stream,
                "vanished" if holder is None else "changed hands",
            )
            self.s.mark_lost()
            return False
        if cancelled is not None:
            return False
        self.s.confirmed(sent)
        return not self.s.stopping()

    # -- its seat in the entry pipeline (_pipeline.Seat) ------------------------------

    @property
    def info(self) -> Mapping[str, Any]:
        return self.s.assignment.info

    @property
    def to_ack(self) -> list[str]:
        return self.s.to_ack

    @property
    def log(self) -> logging.LoggerAdapter[logging.Logger]:
        return self.s.log

    async def pause(self, delay_s: float) -> bool:
        return await self.s.pause(delay_s)

    async def may_hand(self) -> bool:
        # finish() ends the stream after the current entry, before the next one.
        return not self.s.finish_requested and await self._lease_valid()

    async def may_retry(self) -> bool:
        return await self._lease_valid()

    def holds(self) -> bool:
        return not self.s.lost

    def dead_letter(self, entry_id: str, fields: dict[str, str], failed: Failed) -> Pairs:
        return entry_dead_letter(
            fields,
            stream=self.s.stream,
            entry_id=entry_id,
            retry_count=self.s.assignment.retry_count,
            attempts=failed.attempts,
            owner=self.s.host.name,
            error=failed.step.error,
            rejected=failed.step.rejected,
            info=self.s.assignment.info,
            job=self.s.assignment.job,
        )

    async def flush(self) -> None:
        """Never due (``ack_interval_s`` is None): the next fenced read acknowledges."""


def _split_at_end(
    batch: list[DataEntry], field: str | bytes, value: str | bytes
) -> tuple[list[DataEntry], DataEntry | None]:
    """The entries of ``batch`` before its first end marker, and that marker (or None):
    the marker is never handed to ``handle()``, and what follows it is not handled."""
    for i, (_, fields) in enumerate(batch):
        if fields.get(field) == value:
            return batch[:i], batch[i]
    return batch, None
