"""The life of one owned stream (docs/design.md#ownership).

:class:`OwnedStream` takes an assignment from acquisition to its end:

1. acquire the stream's lock with a token unique to this acquisition;
2. loop: one fenced script call acks the previous batch and reads the next (pending
   entries of a previous owner first); hand each entry to ``handle()`` in order while
   the local lease is valid; wait with a plain ``XREAD BLOCK`` when idle;
3. a failing entry is retried or dead-lettered as :func:`after_failure` decides;
4. end in exactly one way: finished (end marker or ``finish()``: complete the
   assignment, THEN release the lock), lost (the lock expired or was taken over:
   stop, ack nothing more, report it), or handed back (shutdown, cancellation, or
   a lock someone else holds: re-queue without counting a retry, then unlock).

The hand-back runs shielded from cancellation and bounded in time, whatever ended
the stream, so a cancelled consumer leaves no lock or lease of its own behind.
"""

from __future__ import annotations

import enum
import functools
import inspect
import logging
import math
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, cast

import anyio
import anyio.to_thread

from . import _tracing
from ._backoff import Backoff
from ._deadletter import DeadLetterReason, describe_error, entry_dead_letter
from ._guard import log_failure
from ._recovery import Recoverer
from ._redis import ACQUIRED_ENDED, NOT_ACQUIRED, StreamGateway, id_order
from ._session import parse_session_token
from ._waiter import Waiter
from ._wire import (
    CANCEL_FIELD,
    EOS_FIELD,
    EOS_VALUE,
    REPLAY_END_FIELD,
    REPLAYED_FROM_FIELD,
    Assignment,
    is_eos,
)
from .config import ConsumerConfig
from .exceptions import (
    DeadLetter,
    HandlerTimeout,
    NoSuchGroup,
    Retry,
    ScriptError,
    WrongKeyType,
)
from .message import Message
from .metrics import EntryOutcome, MetricsRecorder, StreamEvent

log = logging.getLogger(__name__)

PERMANENT = (WrongKeyType, ScriptError)
"""Errors about a data stream that no retry can fix: its assignment is dead-lettered."""

CLEANUP_TIMEOUT_S = 5.0
"""Bound on each shielded clean-up step (hand-back, report of a loss)."""

RECHECK_AFTER_S = 0.05
"""Longest time entries are handed to ``handle()`` on a lock not confirmed meanwhile.

A lock can vanish before its TTL (an operator, eviction, a clock step on the server):
past this long since the last call that proved it ours (acquire, heartbeat, fenced
read), the lock is read again before the next ``handle()`` call. Fast handlers pay one
GET per batch at most; slow ones one per call, negligible beside the call."""


# -- what to do after a handler failure (pure) -------------------------------------------


@dataclass(frozen=True, slots=True)
class RetryAfter:
    """Call ``handle()`` again for the same entry after ``delay_s``."""

    delay_s: float


@dataclass(frozen=True, slots=True)
class GiveUp:
    """Dead-letter the entry with ``error`` as its ``_error``, then go on.

    ``rejected`` is the handler's own reason when it raised ``DeadLetter`` (the dead
    letter's reason is then ``rejected``), None when it kept failing."""

    error: str
    rejected: str | None = None


def after_failure(
    error: BaseException,
    attempt: int,
    *,
    max_attempts: int,
    backoff_s: float,
    backoff_max_s: float,
) -> RetryAfter | GiveUp:
    """The next step after attempt number ``attempt`` (1-based) of an entry raised ``error``.

    * :class:`~streamjobs.DeadLetter`: give up now.
    * Attempts used up (``attempt >= max_attempts``): give up.
    * :class:`~streamjobs.Retry`: retry after its ``delay_s`` (it counts as an attempt).
    * Anything else: retry after ``backoff_s * 2**(attempt - 1)``, capped at
      ``backoff_max_s``.
    """
    if isinstance(error, DeadLetter):
        return GiveUp(f"DeadLetter: {error.reason}", rejected=error.reason)
    if attempt >= max_attempts:
        return GiveUp(describe_error(error))
    if isinstance(error, Retry):
        return RetryAfter(error.delay_s)
    exponent = min(attempt - 1, 64)  # 2**64 times any backoff is past every cap
    return RetryAfter(min(backoff_max_s, backoff_s * 2.0**exponent))


# -- what a stream needs from its consumer --------------------------------------------------


class Hooks(Protocol):
    """The user's side of the contract (``StreamConsumer`` satisfies it). ``handle`` is
    a coroutine function or a plain function (run in a worker thread: see
    :func:`entry_caller`)."""

    def handle(self, message: Message) -> Awaitable[None] | None: ...
    async def on_stream_start(self, stream: str, info: Mapping[str, Any]) -> None: ...
    async def on_stream_end(self, stream: str) -> None: ...
    async def on_stream_lost(self, stream: str) -> None: ...
    async def on_stream_cancelled(self, stream: str, reason: str) -> None: ...


class Host(Protocol):
    """The consumer runtime, as one of its streams sees it."""

    gateway: StreamGateway
    recoverer: Recoverer
    config: ConsumerConfig
    metrics: MetricsRecorder
    hooks: Hooks
    call_handle: Callable[[Message], Awaitable[None]]
    """``hooks.handle`` as a coroutine function (:func:`entry_caller`)."""
    service: str
    name: str
    entry_size_hint: int
    waiter: Waiter | None
    """The multiplexed idle wait (standalone servers), or None: each stream blocks
    on a read of its own."""
    """Bytes of the largest entry in the last batch any stream read: sizes first reads."""
    session_confirmed_at: float | None
    """Under ``Liveness.SESSION``: when (monotonic) the call that last renewed the
    session was sent, or None while there is no live session; under ``Liveness.LOCK``
    always None. Each lock then lives as long as the session."""

    @property
    def lock_ttl_ms(self) -> int:
        """The TTL locks are taken and extended with (docs/design.md#liveness)."""

    def lock_token(self) -> str:
        """A fresh token for a stream's lock."""

    @property
    def draining(self) -> bool:
        """Shutdown began: hand no more entries to ``handle()``."""

    def adopt(self, stream: OwnedStream) -> None:
        """``stream`` now holds its lock."""

    def disown(self, stream: OwnedStream) -> None:
        """``stream`` no longer holds its lock (finished, lost or handed back)."""

    def spawn(self, fn: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run ``fn`` in the background, outliving the stream's own task."""


SYNC_HANDLER_THREADS = 40
"""Worker threads one consumer runs a plain ``def handle()`` in at most: further calls
wait for a thread (docs/design.md#handling-entries)."""


def handler_kind_problem(handle: Any) -> str | None:
    """Why ``handle`` cannot be a handler (None if it can): it must be a coroutine
    function or a plain function; a generator of either kind would never run its body
    as a call."""
    if inspect.isasyncgenfunction(handle):
        return "an async generator function (it yields)"
    if inspect.isgeneratorfunction(handle):
        return "a generator function (it yields)"
    if not callable(handle):
        return f"not callable ({type(handle).__name__})"
    return None


def entry_caller(
    handle: Callable[[Message], Awaitable[None] | None],
) -> Callable[[Message], Awaitable[None]]:
    """``handle`` as a coroutine function.

    A coroutine function is returned as it is. A plain function runs in a worker thread
    (``anyio.to_thread``, at most :data:`SYNC_HANDLER_THREADS` at once per consumer),
    with the same retries, timeout and dead letters: its exceptions are the call's. A
    call past ``handler_timeout_s``, or cancelled at shutdown, stops waiting for the
    thread, which runs on until the function returns (a thread cannot be interrupted),
    holding its slot. If the function returns an awaitable (a plain ``def`` wrapping
    a coroutine, say), that is awaited on the event loop.
    """
    if inspect.iscoroutinefunction(handle):
        return cast("Callable[[Message], Awaitable[None]]", handle)
    limiter: anyio.CapacityLimiter | None = None  # made in the event loop, at first use

    async def call_in_thread(message: Message) -> None:
        nonlocal limiter
        if limiter is None:
            limiter = anyio.CapacityLimiter(SYNC_HANDLER_THREADS)
        result = await anyio.to_thread.run_sync(
            handle, message, limiter=limiter, abandon_on_cancel=True
        )
        if inspect.isawaitable(result):
            await result

    return call_in_thread


async def _call_within(
    handle: Callable[[Message], Awaitable[None]], timeout_s: float, message: Message
) -> None:
    """``handle(message)``, cancelled past ``timeout_s`` (a failed attempt)."""
    with anyio.move_on_after(timeout_s) as scope:
        await handle(message)
    if scope.cancelled_caught:
        raise HandlerTimeout(f"handle() did not return within {timeout_s}s")


class Outcome(enum.Enum):
    FINISHED = "finished"
    SETTLED = "settled"  # dead-lettered, or re-queued with a retry: nothing left to do
    LOST = "lost"
    STOPPED = "stopped"  # shutdown, cancellation, or a lock held by someone else


class OwnedStream:
    """One assignment, from acquiring its stream's lock to finishing or giving it up."""

    def __init__(self, host: Host, assignment: Assignment) -> None:
        self.host = host
        self.assignment = assignment
        self.token = host.lock_token()
        self.lock_extended_at = 0.0  # monotonic: when the lock's TTL was last set
        self.acquired = False
        self.lost = False
        self.finish_requested = False
        self.lease_deadline = 0.0
        # The next monotonic time at which an entry must not be handed on without a
        # check: the lease deadline, or RECHECK_AFTER_S after the lock was last proved.
        self.check_at = 0.0
        self.to_ack: list[str] = []
        # Set once the end marker was read (or finish() asked for): from then on the
        # stream is completed, never handed back. The marker's id is acked only by
        # the release that ends the stream, so a stream whose completion did not
        # happen keeps its marker for the next owner.
        self._ending = False
        self._eos: list[str] = []
        self._completed = False  # a finish call of ours deleted the assignment
        self._sealed = False  # the final acks and the retention are written
        self.unusable: Exception | None = None  # a permanent error about the data stream
        self.contended = False  # its lock stayed someone else's for a heartbeat interval
        self.acquire_error: str | None = None  # the last error of a failed acquire
        self.job_ended = False  # acquired, but the job had ended early: only complete it
        self.stale = False  # the assignment was no longer ours when we came to it
        self.handling = False  # in a batch of handle() calls (statistics)
        self.cancel_reason: str | None = None  # Producer.cancel_stream's reason
        # Created only when someone waits on this stream's state: an idle stream
        # holds none (an event and its deque cost about 1 KiB, per stream).
        self._changed: anyio.Event | None = None
        self._scope = anyio.CancelScope()
        self._wait_scope: anyio.CancelScope | None = None
        self._log: logging.LoggerAdapter[logging.Logger] | None = None

    @property
    def stream(self) -> str:
        return self.assignment.stream

    @property
    def log(self) -> logging.LoggerAdapter[logging.Logger]:
        """This stream's logger: every line carries ``log_extra()`` as its ``extra``.
        Built on first use: most streams never log, and an adapter with its ``extra``
        costs about 0.3 KiB per stream."""
        adapter = self._log
        if adapter is None:
            adapter = self._log = logging.LoggerAdapter(log, self.log_extra())
        return adapter

    @property
    def ending(self) -> bool:
        """The end was reached (marker or ``finish()``): it completes, or is lost."""
        return self._ending

    # -- called by the runtime -------------------------------------------------------

    def renew(self, confirmed_at: float) -> None:
        """The lock was (re)confirmed by a call sent at ``confirmed_at`` (monotonic)."""
        cfg = self.host.config
        self.lease_deadline = confirmed_at + cfg.lock_ttl_s - cfg.margin_s
        self.confirmed(confirmed_at)
        self._notify()

    def confirmed(self, sent_at: float) -> None:
        """A call sent at ``sent_at`` found the lock ours (it did not extend it)."""
        self.check_at = min(self.lease_deadline, max(self.check_at, sent_at + RECHECK_AFTER_S))

    def heartbeat_failed(self) -> None:
        """Wake waiters, so a lapsed lease is noticed."""
        self._notify()

    def interrupt(self) -> None:
        """Shutdown began: stop waiting for entries and stop after the current one."""
        if self._wait_scope is not None:
            self._wait_scope.cancel()
        self._notify()

    def request_finish(self) -> None:
        """``finish()``: end after the current entry, or now if waiting for entries."""
        self.finish_requested = True
        if self._wait_scope is not None:
            self._wait_scope.cancel()

    def cancel(self) -> None:
        """The grace period is over: cancel whatever runs (the hand-back still runs)."""
        self._scope.cancel()

    def mark_lost(self) -> None:
        """The lock is gone or someone else's: stop at once, ack nothing, tell the user."""
        if self.lost:
            return
        self.lost = True
        self.to_ack = []  # a disowned consumer acks nothing
        if self._wait_scope is not None:
            self._wait_scope.cancel()
        self._notify()
        host = self.host
        host.metrics.stream_event(host.service, StreamEvent.LOST)
        self.log.warning("lost stream %r (lock expired or taken over)", self.stream)
        _tracing.mark("streamjobs.stream_lost", self.log_extra())
        # Reported now, not when the in-flight handler returns (it may run for long).
        host.spawn(self._report_lost)

    # -- the life ----------------------------------------------------------------------

    async def run(self) -> None:
        outcome = Outcome.STOPPED
        try:
            with self._scope:
                if await self._acquire():
                    outcome = await self._process()
                elif self.unusable is not None:
                    outcome = await self._dead_letter_assignment(self.unusable)
                elif self.contended:
                    outcome = await self._give_back_contended()
                elif self.stale:
                    outcome = Outcome.SETTLED
        finally:
            with anyio.CancelScope(shield=True):
                await self._settle(outcome)

    def _notify(self) -> None:
        """Wake every waiter on this stream's state (lease, lost, shutdown)."""
        changed, self._changed = self._changed, None
        if changed is not None:
            changed.set()

    def _state_changed(self) -> anyio.Event:
        """The event the next ``_notify`` sets."""
        if self._changed is None:
            self._changed = anyio.Event()
        return self._changed

    def _stopping(self) -> bool:
        return self.lost or self.host.draining

    async def _acquire(self) -> bool:
        """Take the lock; False (to hand the assignment back) if someone holds it.

        A lock that names a dead session (``Liveness.SESSION``, whichever liveness this
        consumer uses) is replaced: the session never comes back, so its owner can
        neither renew it nor pass a fenced call again.
        """
        host, cfg = self.host, self.host.config
        if not await self._still_assigned():
            return False
        backoff = Backoff(base_s=0.05, cap_s=cfg.heartbeat_s)
        give_up_at = time.monotonic() + cfg.heartbeat_s
        replace = ""
        while not host.draining:
            sent = time.monotonic()
            try:
                taken = await host.gateway.acquire(
                    self.stream, self.token, host.lock_ttl_ms, replace, self.assignment.first_id
                )
                if taken != NOT_ACQUIRED:
                    self.acquired = True
                    # The job ended early and its owner died before completing it.
                    self.job_ended = taken == ACQUIRED_ENDED
                    self.lock_extended_at = sent
                    session_at = host.session_confirmed_at
                    self.renew(sent if session_at is None else min(sent, session_at))
                    host.adopt(self)
                    host.metrics.stream_event(host.service, StreamEvent.ACQUIRED)
                    if log.isEnabledFor(logging.DEBUG):
                        self.log.debug("acquired stream %r", self.stream)
                    await self._record_lease()
                    await self._report_recovery()
                    return True
                replace = await self._dead_holder()
                if replace and time.monotonic() < give_up_at:
                    continue
            except PERMANENT as exc:
                self.unusable = exc
                return False
            except Exception as exc:
                self.acquire_error = f"{type(exc).__name__}: {exc}"
                host.metrics.loop_error(host.service, "acquire")
                log_failure(self.log, f"stream {self.stream!r}: acquire", exc, 0.0)
            if time.monotonic() >= give_up_at:
                host.metrics.stream_event(host.service, StreamEvent.CONTENDED)
                self.contended = True
                return False
            # Usually a graceful hand-back whose unlock is a moment behind its re-queue.
            await anyio.sleep(backoff.next_delay())
        return False

    async def _dead_holder(self) -> str:
        """The token holding the lock if it names a dead session, else ''."""
        _, dead = await self.host.gateway.lock_state(self.stream)
        parsed = None if dead is None else parse_session_token(dead)
        if dead is None or parsed is None:
            return ""
        self.log.info(
            "stream %r: its lock names the dead session of %r: taking it over",
            self.stream,
            parsed.consumer,
        )
        return dead

    async def _report_recovery(self) -> None:
        """A recovered assignment (it carries ``_lost_at``): report how long the stream
        went without an owner, on the server's clock."""
        lost_at_ms = self.assignment.lost_at_ms
        if lost_at_ms is None:
            return
        host = self.host
        try:
            now_ms = await host.gateway.server_time_ms()
        except Exception:
            return  # only a metric is lost
        seconds = max(0, now_ms - lost_at_ms) / 1000
        host.metrics.recovery_latency(host.service, seconds)
        self.log.info(
            "resumed stream %r %.2fs after its previous owner was lost (retry %d)",
            self.stream,
            seconds,
            self.assignment.retry_count,
        )

    def log_extra(self) -> dict[str, str]:
        """The ``extra`` of this stream's log lines (structured loggers pick them up)."""
        return {
            "service": self.host.service,
            "consumer": self.host.name,
            "stream": self.stream,
            "assignment_id": self.assignment.id,
        }

    async def _still_assigned(self) -> bool:
        """False if the assignment is no longer pending with this consumer.

        A consumer stalled between reading an assignment and taking its lock (a GC
        pause, a frozen VM) may find that recovery re-queued it meanwhile, and that
        another consumer ran the copy: taking the lock now would run a finished job
        again. If Redis cannot say, the job goes on: a stream whose end was already
        handled is recognised after the first read (see ``_process``).
        """
        host = self.host
        try:
            owner = await host.gateway.pending_owner(self.assignment.id)
        except Exception as exc:
            log_failure(self.log, f"stream {self.stream!r}: checking its assignment", exc, 0.0)
            return True
        if owner == host.name:
            return True
        self.log.warning(
            "assignment %s of stream %r was re-queued or finished while this consumer "
            "was stalled: dropping it",
            self.assignment.id,
            self.stream,
        )
        self.stale = True
        return False

    async def _record_lease(self) -> None:
        host = self.host
        try:
            await host.gateway.record_leases([self.assignment.id], host.lock_ttl_ms, new=True)
        except Exception as exc:
            # Without a lease record a crash is still found, by the XPENDING scan after
            # min_idle_s instead of the lease sweep.
            host.metrics.loop_error(host.service, "acquire")
            log_failure(self.log, f"stream {self.stream!r}: recording its lease", exc, 0.0)

    async def _process(self) -> Outcome:
        """Hand the stream's entries to ``handle()`` until it ends, is lost or we stop."""
        host = self.host
        stream = self.stream
        begun = False  # on_stream_start called
        backoff = Backoff()
        count = self._first_count()
        idle_timeout_s = host.config.stream_idle_timeout_s
        active_at = time.monotonic()  # last time an entry (or the acquisition) came
        claim = False  # the last read returned pending entries: claim before reading new
        if self.job_ended:
            return await self._complete_silently()
        while True:
            if self.lost:
                return Outcome.LOST
            if host.draining:
                return Outcome.STOPPED
            if self.finish_requested:
                return await self._finish()
            sent = time.monotonic()
            try:
                reply = await host.gateway.fenced_read(
                    stream, self.token, host.name, count, self.to_ack, claim=claim
                )
            except NoSuchGroup as exc:
                return await self._vanished(exc)
            except PERMANENT as exc:
                return await self._dead_letter_assignment(exc)
            except Exception as exc:
                claim = True  # a read whose reply was lost left entries pending with us
                host.metrics.loop_error(host.service, "stream")
                delay = backoff.next_delay()
                log_failure(self.log, f"stream {stream!r}", exc, delay)
                await self._pause(delay)
                continue
            backoff.reset()
            ok, top, batch = reply.owned, reply.top, reply.entries
            largest, claim = reply.largest_bytes, reply.claimed
            if not ok:
                self.mark_lost()
                return Outcome.LOST
            self.confirmed(sent)
            self.to_ack = []
            if reply.cancelled is not None:
                return await self._cancel(reply.cancelled)
            if batch:
                count = self._next_count(largest)
                if self.assignment.run:
                    batch = self._run_entries(batch)
            if not begun:
                if not batch and await self._already_finished(top):
                    return await self._complete_silently()
                begun = True
                try:
                    await host.hooks.on_stream_start(stream, self.assignment.info)
                except Exception:
                    self.log.exception("on_stream_start(%r) raised; continuing", stream)
            if not batch:
                idle_left_s = math.inf
                if idle_timeout_s is not None:
                    idle_left_s = idle_timeout_s - (time.monotonic() - active_at)
                    if idle_left_s <= 0:
                        return await self._abandon(idle_timeout_s)
                await self._wait_for_entries(top, idle_left_s)
                continue
            active_at = time.monotonic()
            info = self.assignment.info
            call = self._caller()
            perf = time.perf_counter
            monotonic = time.monotonic
            durations: list[float] = []
            self.handling = True
            try:
                for entry_id, fields in batch:
                    if fields.get(EOS_FIELD) == EOS_VALUE or self.finish_requested:
                        self._count_handled(durations)
                        if is_eos(fields):
                            self._eos = [entry_id]
                            if CANCEL_FIELD in fields:
                                return await self._cancel(fields[CANCEL_FIELD])
                        return await self._finish()
                    # Hot path: one clock read and no extra await per entry while the
                    # lock was proved ours within RECHECK_AFTER_S and the local lease
                    # is valid; the slow path re-reads the lock, or waits for a
                    # heartbeat.
                    if (
                        self.lost or host.draining or monotonic() >= self.check_at
                    ) and not await self._lease_valid():
                        break
                    started = perf()
                    try:
                        await call(Message(stream, entry_id, fields, info, 1))
                    except Exception as exc:
                        if not await self._retry_entry(entry_id, fields, exc, started):
                            break
                    else:
                        durations.append(perf() - started)
                    self.to_ack.append(entry_id)
            finally:
                self.handling = False
            self._count_handled(durations)
            if self.finish_requested:
                return await self._finish()

    def _run_entries(
        self, batch: list[tuple[str, dict[str, str]]]
    ) -> list[tuple[str, dict[str, str]]]:
        """What a DLQ replay's run hands over of ``batch``: its replayed copies and its
        replay's end marker. Anything else was appended to an ended job after its end
        (its producer did not know), between the run's queueing and its entries'
        placement: acked, never handled (docs/design.md#job-identity)."""
        own = []
        for entry_id, fields in batch:
            if REPLAYED_FROM_FIELD in fields or REPLAY_END_FIELD in fields:
                own.append((entry_id, fields))
            else:
                self.to_ack.append(entry_id)
        return own

    def _first_count(self) -> int:
        """Entries to read first: sized by the largest entry the consumer saw last."""
        return self._count_for(self.host.entry_size_hint)

    def _next_count(self, largest_bytes: int) -> int:
        """Entries to read next, so that entries as large as the largest of the batch
        just read fit in ``read_batch_bytes`` (at least one: a larger entry is read
        alone). Also the consumer's hint for the first read of other streams."""
        self.host.entry_size_hint = largest_bytes
        return self._count_for(largest_bytes)

    def _count_for(self, entry_bytes: int) -> int:
        cfg = self.host.config
        return max(1, min(cfg.read_batch_size, cfg.read_batch_bytes // max(1, entry_bytes)))

    def _caller(self) -> Callable[[Message], Awaitable[None]]:
        """What calls ``handle()``: the user's method itself, unless a call has a time
        limit (``handler_timeout_s``) or a tracer provider is configured (a CONSUMER
        span per call). Looked up once per batch."""
        host = self.host
        call: Callable[[Message], Awaitable[None]] = host.call_handle
        timeout_s = host.config.handler_timeout_s
        if timeout_s is not None:
            call = functools.partial(_call_within, call, timeout_s)
        tracer = _tracing.tracer()
        if tracer is not None:
            call = functools.partial(
                _tracing.handle_in_span,
                tracer,
                call,
                group=host.gateway.keys.group,
                consumer=host.name,
            )
        return call

    def _count_handled(self, durations: list[float]) -> None:
        if durations:
            self.host.metrics.entries_handled(self.host.service, EntryOutcome.OK, durations)

    async def _wait_for_entries(self, top: str, longest_s: float = math.inf) -> None:
        host = self.host
        with anyio.CancelScope() as self._wait_scope:
            if self._stopping() or self.finish_requested:
                return
            try:
                waiter = host.waiter
                if waiter is None:
                    await host.gateway.wait_for_entries(self.stream, top, host.config.read_block_ms)
                else:
                    fallback_s = host.config.read_block_ms / 1000
                    timeout_s = min(longest_s, waiter.idle_timeout_s(self.stream, fallback_s))
                    # This scope's deadline, not one more scope per idle stream.
                    self._wait_scope.deadline = anyio.current_time() + timeout_s
                    await waiter.wait(self.stream, top, math.inf)
            except Exception as exc:
                host.metrics.loop_error(host.service, "stream")
                delay = Backoff().next_delay()
                log_failure(self.log, f"stream {self.stream!r}: waiting for entries", exc, delay)
                await anyio.sleep(delay)
        self._wait_scope = None

    async def _pause(self, delay_s: float) -> bool:
        """Sleep ``delay_s`` unless the stream is lost or shutdown starts; True if it slept."""
        deadline = time.monotonic() + delay_s
        while True:
            changed = self._state_changed()
            if self._stopping():
                return False
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return True
            with anyio.move_on_after(remaining):
                await changed.wait()

    async def _lease_valid(self) -> bool:
        """True if the next entry may be handed to ``handle()``.

        Past the lease deadline (a pause, or heartbeats failing) wait for the heartbeat
        to extend the lock or to find it lost; never hand an entry on an expired lease.
        Before it, but more than ``RECHECK_AFTER_S`` since the lock was last proved
        ours, read the lock: one that vanished or changed hands early is lost now, not
        at the next heartbeat.
        """
        while True:
            changed = self._state_changed()
            if self._stopping():
                return False
            now = time.monotonic()
            if now >= self.lease_deadline:
                await changed.wait()
                continue
            if now < self.check_at:
                return True
            return await self._recheck(now)

    async def _recheck(self, sent: float) -> bool:
        """Read the lock (and the cancel marker, in the same round trip): False if the
        stream was lost, or cancelled (the next fenced read then ends it, so a batch of
        slow entries is not handled to its end first)."""
        host = self.host
        try:
            holder, cancelled = await host.gateway.lock_and_cancel(self.stream)
        except Exception as exc:
            # Redis cannot say: the local lease still bounds the risk. Ask again later.
            host.metrics.loop_error(host.service, "stream")
            log_failure(self.log, f"stream {self.stream!r}: re-reading its lock", exc, 0.0)
            self.confirmed(sent)
            return not self._stopping()
        if holder != self.token:
            self.log.warning(
                "stream %r: its lock %s before its TTL (operator, eviction or a server "
                "clock step?)",
                self.stream,
                "vanished" if holder is None else "changed hands",
            )
            self.mark_lost()
            return False
        if cancelled is not None:
            return False
        self.confirmed(sent)
        return not self._stopping()

    async def _retry_entry(
        self, entry_id: str, fields: dict[str, str], first: Exception, started: float
    ) -> bool:
        """Attempts 2.. of an entry whose first ``handle()`` call, begun at ``started``
        (``time.perf_counter()``), raised ``first``.

        Returns:
            True if the entry is done (handled or dead-lettered), False if the stream
            was lost or shutdown began while retrying (the entry stays unacked).
        """
        host, cfg = self.host, self.host.config
        attempt = 1
        error: Exception = first
        while True:
            host.metrics.handler_failed(host.service)
            step = after_failure(
                error,
                attempt,
                max_attempts=cfg.max_handler_attempts,
                backoff_s=cfg.handler_backoff_s,
                backoff_max_s=cfg.handler_backoff_max_s,
            )
            if isinstance(step, GiveUp):
                self.log.warning(
                    "stream %r entry %s failed %d time(s) (%s): dead-lettering it",
                    self.stream,
                    entry_id,
                    attempt,
                    step.error,
                )
                if not await self._dead_letter(
                    entry_id, fields, attempt, step.error, step.rejected
                ):
                    return False
                self._count_one(EntryOutcome.DEAD_LETTERED, started)
                return True
            if not await self._pause(step.delay_s) or not await self._lease_valid():
                return False
            attempt += 1
            message = Message(self.stream, entry_id, fields, self.assignment.info, attempt)
            try:
                await self._caller()(message)
            except Exception as exc:
                error = exc
                continue
            self._count_one(EntryOutcome.RETRIED, started)
            return True

    def _count_one(self, outcome: EntryOutcome, started: float) -> None:
        elapsed = time.perf_counter() - started
        self.host.metrics.entries_handled(self.host.service, outcome, (elapsed,))

    async def _dead_letter(
        self,
        entry_id: str,
        fields: dict[str, str],
        attempts: int,
        error: str,
        rejected: str | None = None,
    ) -> bool:
        """Append a dead letter for a data entry; True once it is written.

        ``rejected``: the reason the handler gave with ``DeadLetter`` (reason
        ``rejected``), or None (``handler_failed``)."""
        host = self.host
        reason = DeadLetterReason.HANDLER_FAILED if rejected is None else DeadLetterReason.REJECTED
        letter = entry_dead_letter(
            fields,
            stream=self.stream,
            entry_id=entry_id,
            retry_count=self.assignment.retry_count,
            attempts=attempts,
            owner=host.name,
            error=error,
            rejected=rejected,
            info=self.assignment.info,
            job=self.assignment.job,
        )
        backoff = Backoff()
        while True:
            try:
                _, trimmed = await host.gateway.dead_letter_entry(letter)
            except Exception as exc:
                host.metrics.loop_error(host.service, "stream")
                delay = backoff.next_delay()
                log_failure(self.log, f"stream {self.stream!r}: writing a dead letter", exc, delay)
                if not await self._pause(delay):
                    return False
                continue
            host.metrics.dead_lettered(host.service, reason)
            _tracing.mark(
                "streamjobs.dead_letter",
                {**self.log_extra(), "entry_id": entry_id, "reason": reason.value},
                parent=fields,
            )
            if trimmed > 0:
                host.metrics.dlq_trimmed(host.service, trimmed)
            return True

    async def _cancel(self, reason: str) -> Outcome:
        """The stream was cancelled: hand nothing more to ``handle()``, and end it as if
        finished, discarding what was not handled (the seal acks what is pending and
        skips what is unread); then ``on_stream_cancelled``."""
        self.log.info("stream %r was cancelled (%s): ending it", self.stream, reason or "-")
        self.cancel_reason = reason
        return await self._finish(StreamEvent.CANCELLED)

    async def _finish(self, event: StreamEvent = StreamEvent.FINISHED) -> Outcome:
        """Complete the assignment, THEN release the lock (never the other way round)."""
        host = self.host
        self._ending = True
        backoff = Backoff()
        while True:
            try:
                done = await self._complete()
                break
            except Exception as exc:
                host.metrics.loop_error(host.service, "stream")
                delay = backoff.next_delay()
                log_failure(self.log, f"stream {self.stream!r}: finishing", exc, delay)
                if not await self._pause(delay):
                    return Outcome.LOST if self.lost else Outcome.STOPPED
        if not done:
            self.mark_lost()
            return Outcome.LOST
        host.metrics.stream_event(host.service, event)
        host.disown(self)
        try:
            if self.cancel_reason is None:
                await host.hooks.on_stream_end(self.stream)
            else:
                await host.hooks.on_stream_cancelled(self.stream, self.cancel_reason)
        except Exception:
            self.log.exception("a hook of stream %r raised", self.stream)
        return Outcome.FINISHED

    async def _already_finished(self, top: str) -> bool:
        """True if the stream's newest entry is this job's end marker, already handled.

        Nothing was left to read, so the marker was delivered and acked by an earlier
        owner, which then died (or its lock expired) before completing the assignment;
        or this assignment is a stale duplicate of one that finished. Either way the
        job is done: running it again would wait forever for entries. A marker older
        than the job's first submission belongs to an earlier job of a reused name:
        the new job's entries are still to come. So does one with the same id: the two
        ids are from different streams, so the previous job's end marker and this
        job's assignment, written in the same millisecond, can both be ``T-0``.
        (An owner that died after ending this job is told by ``acquire.lua``, from the
        ended-job marker; this check is the fallback.)
        """
        if self.assignment.run:
            return False  # its end marker comes with its entries; acquire.lua tells the rest
        if top == "0-0" or id_order(top) <= id_order(self.assignment.first_id):
            return False
        try:
            return await self.host.gateway.is_end_marker(self.stream, top)
        except Exception as exc:
            log_failure(self.log, f"stream {self.stream!r}: reading its newest entry", exc, 0.0)
            return False

    async def _complete_silently(self) -> Outcome:
        """Complete an assignment whose stream was already handled to its end.

        No hook is called: the stream's work was done (and reported) before. The
        completion gives the stream back its retention, which acquiring it cleared.
        """
        self.log.info(
            "stream %r was already handled to its end: completing its assignment", self.stream
        )
        self._ending = True
        try:
            await self._complete()
        except Exception as exc:
            log_failure(self.log, f"stream {self.stream!r}: completing", exc, 0.0)
            return Outcome.STOPPED  # handed back; the next owner finds the same
        self.host.disown(self)
        return Outcome.SETTLED

    async def _vanished(self, exc: NoSuchGroup) -> Outcome:
        """The data stream (or its group) was deleted or expired while we owned it.

        Nothing of it is left to handle: its assignment is completed like a finished
        one, so that the slot, the lock, the lease and the assignment do not leak.
        """
        self.log.warning(
            "stream %r vanished while owned (deleted, expired, or its group destroyed: "
            "%s): completing its assignment",
            self.stream,
            exc,
        )
        return await self._finish(StreamEvent.VANISHED)

    async def _dead_letter_assignment(self, exc: Exception) -> Outcome:
        """The data stream cannot be used (a key of another type, a script error): retrying
        cannot help, so the assignment goes to the dead-letter stream, then the lock."""
        self.log.error(
            "stream %r cannot be processed (%s): dead-lettering its assignment", self.stream, exc
        )
        return await self._end_dead_lettered(
            DeadLetterReason.UNUSABLE_STREAM, f"{type(exc).__name__}: {exc}", keep_ms=-1
        )

    async def _abandon(self, idle_timeout_s: float) -> Outcome:
        """No entry came for ``stream_idle_timeout_s``: give up the assignment for good.

        Its dead letter says why (and can be replayed); the stream gets the retention
        of a finished one, so an empty stream made by acquiring it does not stay.
        """
        self.log.warning(
            "stream %r got no entry for %gs (stream_idle_timeout_s): dead-lettering its assignment",
            self.stream,
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
        host = self.host
        backoff = Backoff()
        while True:
            try:
                await host.recoverer.dead_letter(
                    self.assignment.id,
                    reason,
                    retry_count=self.assignment.retry_count,
                    owner=host.name,
                    error=error,
                )
                await host.gateway.release(self.stream, self.token, keep_ms, self.to_ack)
                self.to_ack = []
                break
            except Exception as failure:
                delay = backoff.next_delay()
                host.metrics.loop_error(host.service, "stream")
                log_failure(self.log, f"dead-lettering stream {self.stream!r}", failure, delay)
                if not await self._pause(delay):
                    return Outcome.LOST if self.lost else Outcome.STOPPED
        host.disown(self)
        return Outcome.SETTLED

    async def _give_back_contended(self) -> Outcome:
        """The lock stayed someone else's for a whole heartbeat interval: most likely a
        duplicate assignment of a stream another consumer is working on.

        It is re-queued with a retry counted, so one that never gets its lock ends in
        the dead-letter stream after ``max_retries`` rounds instead of cycling forever.
        (A graceful hand-back whose unlock trails its re-queue by a moment is absorbed
        by the acquire loop's own retries and never gets here.)
        """
        host = self.host
        nxt = self.assignment.retry_count + 1
        try:
            if nxt > host.recoverer.max_retries:
                why = (
                    "the stream's lock stayed held by another owner (a duplicate assignment?)"
                    if self.acquire_error is None
                    else f"taking the stream's lock kept failing: {self.acquire_error}"
                )
                self.log.warning(
                    "assignment %s never got the lock of %r (%s): dead-lettering it",
                    self.assignment.id,
                    self.stream,
                    why,
                )
                await host.recoverer.dead_letter(
                    self.assignment.id,
                    DeadLetterReason.MAX_RETRIES_EXCEEDED,
                    retry_count=nxt,
                    owner=host.name,
                    error=why,
                )
            else:
                await host.gateway.requeue(self.assignment.id, nxt)
        except Exception as exc:
            log_failure(
                self.log, f"stream {self.stream!r}: giving back a contended assignment", exc, 0
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
        the lock expires by itself and the stream already has its retention.
        ``finish`` answers False when the assignment is no longer pending: after an
        earlier attempt of ours whose reply was lost (``_completed`` tells), or after
        a recoverer re-queued it (the release's token check then refuses too).

        Returns:
            True if the stream is finished, False if it was lost.

        Raises:
            RedisUnavailable, RedisCommandError: try again.
        """
        host = self.host
        retention_ms = self._retention_ms()
        if not self._sealed:
            if not await host.gateway.seal(
                self.stream,
                self.token,
                retention_ms,
                [*self.to_ack, *self._eos],
                # A cancel, or a finish() that came before any end marker was read,
                # skips what is left of this job (acked unhandled, the group moved to
                # the stream's end): left in place it would be the first thing the
                # next job of the same name reads (docs/design.md#finishing-and-hand-back).
                cancelled=self.cancel_reason is not None
                or (self.finish_requested and not self._eos),
                job=self.assignment.first_id,
            ):
                return self._completed
            self._sealed = True
            self.to_ack, self._eos = [], []
        if await host.gateway.finish(self.assignment.id):
            self._completed = True
        # The retention was set by the seal; only "delete at once" is left to do.
        released = await host.gateway.release(
            self.stream, self.token, 0 if retention_ms == 0 else -1
        )
        return self._completed or released

    def _retention_ms(self) -> int:
        """What completing does to a finished data stream: -1 keep, 0 delete, >0 PEXPIRE."""
        ttl_s = self.host.config.finished_stream_ttl_s
        return -1 if ttl_s is None else math.ceil(ttl_s * 1000)

    async def _report_lost(self) -> None:
        with anyio.move_on_after(CLEANUP_TIMEOUT_S):
            try:
                await self.host.hooks.on_stream_lost(self.stream)
            except Exception:
                self.log.exception("on_stream_lost(%r) raised", self.stream)

    async def _settle(self, outcome: Outcome) -> None:
        """Clean-up after the stream's task ended (shielded): hand back what is unfinished."""
        if outcome in (Outcome.FINISHED, Outcome.SETTLED):
            return
        self.host.disown(self)
        if self.lost:
            return
        with anyio.move_on_after(CLEANUP_TIMEOUT_S):
            if self._ending:
                await self._complete_on_exit()
            else:
                await self._hand_back()

    async def _complete_on_exit(self) -> None:
        """A stream that reached its end when shutdown or cancellation came: complete it.

        If that fails, hand it back instead. The next owner either reads the end marker
        (the seal had not happened) and finishes the stream, or finds it sealed and only
        completes the assignment.
        """
        host = self.host
        try:
            done = await self._complete()
        except Exception as exc:
            log_failure(self.log, f"stream {self.stream!r}: finishing on exit", exc, 0.0)
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
        host = self.host
        gw = host.gateway
        try:
            if self.acquired:
                read = await gw.fenced_read(self.stream, self.token, host.name, 0, self.to_ack)
                self.to_ack = []
                if not read.owned:
                    self.mark_lost()
                    return
            await gw.requeue(self.assignment.id, None)
            await gw.release(self.stream, self.token, -1)
        except Exception as exc:
            log_failure(
                self.log,
                f"could not hand back stream {self.stream!r}: it will be recovered",
                exc,
                0.0,
            )
            return
        if self.acquired:
            host.metrics.stream_event(host.service, StreamEvent.HANDED_BACK)
            self.log.info("handed back stream %r", self.stream)
            _tracing.mark("streamjobs.hand_back", self.log_extra())
