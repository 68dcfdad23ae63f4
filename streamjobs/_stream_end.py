"""How an owned stream ends: sealed and finished, cancelled, vanished, its assignment
dead-lettered or abandoned, given back when contended, lost, or handed back at a stop."""

from __future__ import annotations

import math

import anyio
import anyio.to_thread

from . import _tracing
from ._backoff import Backoff
from ._dlq_reason import DeadLetterReason
from ._guard import log_failure
from ._redis._replies import id_order
from ._stream_state import (
    CLEANUP_TIMEOUT_S,
    Outcome,
    OwnedStreamState,
)
from .config import ClusterMode
from .exceptions import (
    NoSuchGroup,
)
from .metrics import StreamEvent


class StreamEnd:
    """The terminal paths of one owned stream (its ``OwnedStream`` holds one)."""

    def __init__(self, s: OwnedStreamState) -> None:
        self.s = s

    async def cancelled(self, reason: str) -> Outcome:
        """The stream was cancelled: hand nothing more to ``handle()``, and end it as if
        finished, discarding what was not handled (the seal acks what is pending and
        skips what is unread); then ``on_stream_cancelled``."""
        self.s.log.info("stream %r was cancelled (%s): ending it", self.s.stream, reason or "-")
        self.s.cancel_reason = reason
        return await self.finish(StreamEvent.CANCELLED)

    async def finish(self, event: StreamEvent = StreamEvent.FINISHED) -> Outcome:
        """Complete the assignment, THEN release the lock (never the other way round)."""
        host = self.s.host
        self.s.ending = True
        backoff = Backoff()
        while True:
            try:
                done = await self._complete()
                break
            except Exception as exc:
                host.metrics.loop_error(host.service, "stream")
                delay = backoff.next_delay()
                log_failure(self.s.log, f"stream {self.s.stream!r}: finishing", exc, delay)
                if not await self.s.pause(delay):
                    return Outcome.LOST if self.s.lost else Outcome.STOPPED
        if not done:
            self.s.mark_lost()
            return Outcome.LOST
        host.metrics.stream_event(host.service, event)
        host.disown(self.s)
        try:
            if self.s.cancel_reason is None:
                await host.hooks.on_stream_end(self.s.stream)
            else:
                await host.hooks.on_stream_cancelled(self.s.stream, self.s.cancel_reason)
        except Exception:
            self.s.log.exception("a hook of stream %r raised", self.s.stream)
        return Outcome.FINISHED

    async def already_finished(self, top: str) -> bool:
        """True if the stream's newest entry is this job's end marker, already handled.

        Nothing was left to read, so the marker was delivered and acked by an earlier
        owner, which then died (or its lock expired) before completing the assignment;
        or this assignment is a stale duplicate of one that finished. Either way the
        job is done: running it again would wait forever for entries. A marker older
        than the job's first submission belongs to an earlier job of a reused name:
        the new job's entries are still to come. So does one of the same millisecond,
        whatever its sequence number: the two ids are from different streams, so the
        previous job's end marker can be ``T-1`` and this job's assignment, written
        after it, ``T-0``. (Comparing whole ids, a consumer that took the new job
        before its first entry was appended read that marker as the new job's end, and
        completed the job without its entries.)
        (An owner that died after ending this job is told by ``acquire.lua``, from the
        ended-job marker; this check is the fallback.)
        """
        if self.s.assignment.run:
            return False  # its end marker comes with its entries; acquire.lua tells the rest
        if top == "0-0" or id_order(top)[0] <= id_order(self.s.assignment.first_id)[0]:
            return False
        try:
            return await self.s.host.gateway.liveness.is_end_marker(self.s.stream, top)
        except Exception as exc:
            log_failure(self.s.log, f"stream {self.s.stream!r}: reading its newest entry", exc, 0.0)
            return False

    async def complete_silently(self) -> Outcome:
        """Complete an assignment whose stream was already handled to its end.

        No hook is called: the stream's work was done (and reported) before. The
        completion gives the stream back its retention, which acquiring it cleared.
        """
        self.s.log.info(
            "stream %r was already handled to its end: completing its assignment", self.s.stream
        )
        self.s.ending = True
        try:
            await self._complete()
        except Exception as exc:
            log_failure(self.s.log, f"stream {self.s.stream!r}: completing", exc, 0.0)
            return Outcome.STOPPED  # handed back; the next owner finds the same
        self.s.host.disown(self.s)
        return Outcome.SETTLED

    async def vanished(self, exc: NoSuchGroup) -> Outcome:
        """The data stream (or its group) was deleted or expired while we owned it.

        Nothing of it is left to handle: its assignment is completed like a finished
        one, so that the slot, the lock, the lease and the assignment do not leak.
        """
        self.s.log.warning(
            "stream %r vanished while owned (deleted, expired, or its group destroyed: "
            "%s): completing its assignment",
            self.s.stream,
            exc,
        )
        return await self.finish(StreamEvent.VANISHED)

    async def dead_letter_assignment(self, exc: Exception) -> Outcome:
        """The data stream cannot be used (a key of another type, a script error): retrying
        cannot help, so the assignment goes to the dead-letter stream, then the lock."""
        self.s.log.error(
            "stream %r cannot be processed (%s): dead-lettering its assignment", self.s.stream, exc
        )
        return await self._end_dead_lettered(
            DeadLetterReason.UNUSABLE_STREAM, f"{type(exc).__name__}: {exc}", keep_ms=-1
        )

    async def abandon(self, idle_timeout_s: float) -> Outcome:
        """No entry came for ``stream_idle_timeout_s``: give up the assignment for good.

        Its dead letter says why (and can be replayed); the stream gets the retention
        of a finished one, so an empty stream made by acquiring it does not stay.
        """
        self.s.log.warning(
            "stream %r got no entry for %gs (stream_idle_timeout_s): dead-lettering its assignment",
            self.s.stream,
            idle_timeout_s,
        )
        return await self._end_dead_lettered(
            DeadLetterReason.IDLE_TIMEOUT,
            f"no entry for {idle_timeout_s:g}s",
            keep_ms=self._retention_ms(),
        )

    async def _end_dead_lettered(
        self, reason: DeadLetterReason, error: str, *, keep_ms: int
    ) -> Outcome:
        """Dead-letter the assignment, then release the lock with ``keep_ms`` retention."""
        host = self.s.host
        backoff = Backoff()
        while True:
            try:
                if host.lock_ttl_ms > host.config.lock_ttl_ms and not self.s.lock_cut:
                    # As the seal does: the assignment goes first, so a death before the
                    # release must not leave a lock with the session's long TTL.
                    await host.gateway.streams.extend_many(
                        [(self.s.stream, self.s.token)], host.config.lock_ttl_ms
                    )
                    self.s.lock_cut = True
                await host.recoverer.dead_letter(
                    self.s.assignment.id,
                    reason,
                    retry_count=self.s.assignment.retry_count,
                    owner=host.name,
                    error=error,
                )
                await host.gateway.completion.release(
                    self.s.stream, self.s.token, keep_ms, self.s.to_ack
                )
                self.s.to_ack = []
                break
            except Exception as failure:
                delay = backoff.next_delay()
                host.metrics.loop_error(host.service, "stream")
                log_failure(self.s.log, f"dead-lettering stream {self.s.stream!r}", failure, delay)
                if not await self.s.pause(delay):
                    return Outcome.LOST if self.s.lost else Outcome.STOPPED
        host.disown(self.s)
        return Outcome.SETTLED

    async def give_back_contended(self) -> Outcome:
        """The lock stayed someone else's for a whole heartbeat interval: most likely a
        duplicate assignment of a stream another consumer is working on.

        It is re-queued with a retry counted, so one that never gets its lock ends in
        the dead-letter stream after ``max_retries`` rounds instead of cycling forever.
        (A graceful hand-back whose unlock trails its re-queue by a moment is absorbed
        by the acquire loop's own retries and never gets here.)
        """
        host = self.s.host
        nxt = self.s.assignment.retry_count + 1
        try:
            if nxt > host.recoverer.max_retries:
                why = (
                    "the stream's lock stayed held by another owner (a duplicate assignment?)"
                    if self.s.acquire_error is None
                    else f"taking the stream's lock kept failing: {self.s.acquire_error}"
                )
                self.s.log.warning(
                    "assignment %s never got the lock of %r (%s): dead-lettering it",
                    self.s.assignment.id,
                    self.s.stream,
                    why,
                )
                await host.recoverer.dead_letter(
                    self.s.assignment.id,
                    DeadLetterReason.MAX_RETRIES_EXCEEDED,
                    retry_count=nxt,
                    owner=host.name,
                    error=why,
                )
            else:
                await host.gateway.assignments.requeue(self.s.assignment.id, nxt)
        except Exception as exc:
            log_failure(
                self.s.log, f"stream {self.s.stream!r}: giving back a contended assignment", exc, 0
            )
            return Outcome.STOPPED  # the plain hand-back then tries, without a count
        return Outcome.SETTLED

    async def _complete(self) -> bool:
        """One attempt at completing; every step is safe to repeat.

        1. Seal (fenced, lock held): ack the last handled entries and the end marker,
           set the retention. Refused: the lock is lost, nothing was acked, and the
           next owner handles the rest again (at-least-once).
        2. Finish the assignment (ack + delete it): from here recovery leaves it alone.
        3. Release the lock (and delete the stream, with a retention of 0).

        If the owner dies between 1 and 2, the assignment is recovered and its next
        owner finds the end marker handled and only completes it; between 2 and 3,
        the lock expires by itself (the seal cut it to ``lock_ttl_s``, in SESSION mode
        too) and the stream already has its retention.
        ``finish`` answers False when the assignment is no longer pending: after an
        earlier attempt of ours whose reply was lost (``_completed`` tells), or after
        a recoverer re-queued it (the release's token check then refuses too).

        Returns:
            True if the stream is finished, False if it was lost.

        Raises:
            RedisUnavailable, RedisCommandError: try again.
        """
        host = self.s.host
        retention_ms = self._retention_ms()
        if not self.s.sealed and host.cluster_mode is ClusterMode.NONE:
            return await self._complete_at_once(retention_ms)
        if not self.s.sealed:
            if not await host.gateway.completion.seal(
                self.s.stream,
                self.s.token,
                retention_ms,
                [*self.s.to_ack, *self.s.eos_ids],
                cancelled=self._ends_early(),
                job=self.s.assignment.first_id,
                # Under SESSION the lock lives 10 minutes: cut to lock_ttl_s, an owner
                # that dies between the finish and the release leaves it that long only.
                lock_cap_ms=host.config.lock_ttl_ms,
            ):
                return self.s.completed
            self.s.sealed = True
            self.s.lock_cut = True
            self.s.to_ack, self.s.eos_ids = [], []
        if await host.gateway.assignments.finish(self.s.assignment.id):
            self.s.completed = True
        # The retention was set by the seal; only "delete at once" is left to do.
        released = await host.gateway.completion.release(
            self.s.stream, self.s.token, 0 if retention_ms == 0 else -1, ended=True
        )
        return self.s.completed or released

    async def _complete_at_once(self, retention_ms: int) -> bool:
        """:meth:`_complete` in one script where every key is on one server
        (``complete.lua``): one round trip, and no crash window between the steps.

        A retry after a failed call may find the lock gone because that call ran and
        released it (its reply was lost). The job was completed if no one holds the
        lock and the stream's ended-job marker names this job (written by that call,
        or by a successor that took the stream over and finished it); otherwise, say
        a recoverer re-queued the assignment while Redis was away and a successor
        holds the lock, the stream is lost.
        """
        host = self.s.host
        try:
            sealed, finished = await host.gateway.completion.complete(
                self.s.stream,
                self.s.token,
                retention_ms,
                self.s.assignment.id,
                [*self.s.to_ack, *self.s.eos_ids],
                cancelled=self._ends_early(),
                job=self.s.assignment.first_id,
            )
        except Exception:
            self.s.reply_lost = True
            raise
        if not sealed:
            if self.s.reply_lost:
                holder, ended_job = await host.gateway.liveness.lock_and_ended(self.s.stream)
                if holder is None and ended_job == self.s.assignment.first_id:
                    self.s.completed = True
            return self.s.completed
        self.s.sealed = self.s.lock_cut = True
        self.s.to_ack, self.s.eos_ids = [], []
        self.s.completed = self.s.completed or finished
        return True

    def _ends_early(self) -> bool:
        """A cancel, or a finish() that came before any end marker was read: the seal
        skips what is left of this job (acked unhandled, the group moved to the
        stream's end). Left in place it would be the first thing the next job of the
        same name reads (docs/design.md#finishing-and-hand-back)."""
        return self.s.cancel_reason is not None or (self.s.finish_requested and not self.s.eos_ids)

    def _retention_ms(self) -> int:
        """What completing does to a finished data stream: -1 keep, 0 delete, >0 PEXPIRE."""
        ttl_s = self.s.host.config.finished_stream_ttl_s
        return -1 if ttl_s is None else math.ceil(ttl_s * 1000)

    async def settle(self, outcome: Outcome) -> None:
        """Clean-up after the stream's task ended (shielded): hand back what is unfinished."""
        if outcome in (Outcome.FINISHED, Outcome.SETTLED):
            return
        self.s.host.disown(self.s)
        if self.s.lost:
            return
        with anyio.move_on_after(CLEANUP_TIMEOUT_S):
            if self.s.ending:
                await self._complete_on_exit()
            else:
                await self._hand_back()

    async def _complete_on_exit(self) -> None:
        """A stream that reached its end when shutdown or cancellation came: complete it.

        If that fails, hand it back instead. The next owner either reads the end marker
        (the seal had not happened) and finishes the stream, or finds it sealed and only
        completes the assignment.
        """
        host = self.s.host
        try:
            done = await self._complete()
        except Exception as exc:
            log_failure(self.s.log, f"stream {self.s.stream!r}: finishing on exit", exc, 0.0)
            await self._hand_back()
            return
        if done:
            host.metrics.stream_event(host.service, StreamEvent.FINISHED)

    async def _hand_back(self) -> None:
        """Give an unfinished stream back at once (docs/design.md#finishing-and-hand-back).

        1. Ack what was handled (fenced): handled work is finished work.
        2. Re-queue the assignment without counting a retry, XACK-first and atomic.
        3. Release the lock (token-checked: a no-op if it was never ours). Re-queue
           comes first so that "pending without a lock", which recoverers treat as a
           dead owner, never happens; a consumer that reads the re-queued assignment
           in between retries the lock for a moment.

        A stream whose acquisition failed or was interrupted goes through the same
        steps but the first: the acquire may have taken the lock even if its reply
        never arrived, and the release's token check makes that safe either way.
        """
        host = self.s.host
        gw = host.gateway
        try:
            if self.s.acquired:
                read = await gw.streams.fenced_read(
                    self.s.stream, self.s.token, host.name, 0, self.s.to_ack
                )
                self.s.to_ack = []
                if not read.owned:
                    self.s.mark_lost()
                    return
            await gw.assignments.requeue(self.s.assignment.id, None)
            await gw.completion.release(self.s.stream, self.s.token, -1)
        except Exception as exc:
            log_failure(
                self.s.log,
                f"could not hand back stream {self.s.stream!r}: it will be recovered",
                exc,
                0.0,
            )
            return
        if self.s.acquired:
            host.metrics.stream_event(host.service, StreamEvent.HANDED_BACK)
            self.s.log.info("handed back stream %r", self.s.stream)
            _tracing.mark("streamjobs.hand_back", self.s.log_extra())
