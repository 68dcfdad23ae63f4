"""The entry pipeline, one for every consumer kind (docs/design.md#handling-entries).

What happens to an entry once a consumer has read it is written here once:
:class:`EntryPipeline` calls ``handle()`` (a coroutine, or a plain function in a worker
thread) within its timeout and inside its span (a child of the entry's trace), decides
after a failure (:func:`after_failure`: ``Retry``, ``DeadLetter``, attempts, backoff),
writes the dead letter, and counts every outcome. A consumer kind supplies a
:class:`Seat` per stream it reads: whether it may still hand entries, what to
acknowledge, and what a dead letter carries. Nothing else differs between the kinds.
"""

from __future__ import annotations

import enum
import functools
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

import anyio
import anyio.to_thread

from . import _tracing
from ._backoff import Backoff
from ._deadletter import Pairs, describe_error
from ._dlq_reason import DeadLetterReason
from ._guard import log_failure
from ._redis._replies import text_fields
from .exceptions import (
    DeadLetter,
    HandlerTimeout,
    Retry,
)
from .message import Message
from .metrics import EntryOutcome, MetricsRecorder


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


class BaseHooks(Protocol):
    """The user's side of every consumer kind: ``handle`` (a coroutine function or a
    plain function, run in a worker thread: see :func:`entry_caller`) and the two
    lifecycle hooks."""

    def handle(self, message: Message[Any]) -> Awaitable[None] | None: ...
    async def on_startup(self) -> None: ...
    async def on_shutdown(self) -> None: ...


class Hooks(BaseHooks, Protocol):
    """The user's side of a ``StreamConsumer``: also the hooks of an owned stream."""

    async def on_stream_start(self, stream: str, info: Mapping[str, Any]) -> None: ...
    async def on_stream_end(self, stream: str) -> None: ...
    async def on_stream_lost(self, stream: str) -> None: ...
    async def on_stream_cancelled(self, stream: str, reason: str) -> None: ...


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
    handle: Callable[[Message[Any]], Awaitable[None] | None],
) -> Callable[[Message[Any]], Awaitable[None]]:
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
        return cast("Callable[[Message[Any]], Awaitable[None]]", handle)
    limiter: anyio.CapacityLimiter | None = None  # made in the event loop, at first use

    async def call_in_thread(message: Message[Any]) -> None:
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
    handle: Callable[[Message[Any]], Awaitable[None]], timeout_s: float, message: Message[Any]
) -> None:
    """``handle(message)``, cancelled past ``timeout_s`` (a failed attempt)."""
    with anyio.move_on_after(timeout_s) as scope:
        await handle(message)
    if scope.cancelled_caught:
        raise HandlerTimeout(f"handle() did not return within {timeout_s}s")


# -- what a consumer kind supplies, per stream ---------------------------------------------


@dataclass(frozen=True, slots=True)
class Failed:
    """Why an entry is dead-lettered: after ``attempts`` calls, as ``step`` gave up."""

    attempts: int
    step: GiveUp


class Admit(enum.Enum):
    """A kind's verdict on one entry before its ``handle()`` call (:class:`Seat`)."""

    HAND = "hand"
    """Hand it to ``handle()``."""
    SKIP = "skip"
    """Settled without a call (the seat acknowledged or dead-lettered it): go on."""
    STOP = "stop"
    """Hand nothing more of this batch: what is left stays pending."""


class Seat(Protocol):
    """One stream as a consumer kind reads it: all the pipeline asks of the kind.

    The pipeline appends what it is done with (handled or dead-lettered) to ``to_ack``;
    the kind sends the acknowledgements: with its next read (``ack_interval_s`` None),
    or by :meth:`flush` once ``ack_interval_s`` has passed since ``last_flush``, and at
    once after a dead letter (another consumer must not handle it again).
    """

    @property
    def to_ack(self) -> list[str]:
        """Ids to acknowledge (the pipeline appends, the kind sends them)."""

    @property
    def ack_interval_s(self) -> float | None:
        """Longest a handled entry waits for its acknowledgement; None: the next read
        carries it."""

    @property
    def last_flush(self) -> float:
        """``time.perf_counter()`` of the last :meth:`flush`."""

    @property
    def loop(self) -> str:
        """The loop name its failures are counted under (``MetricsRecorder.loop_error``)."""

    @property
    def stream(self) -> str:
        """The stream's name."""

    @property
    def info(self) -> Mapping[str, Any]:
        """The ``info`` every message of this stream carries."""

    @property
    def log(self) -> logging.LoggerAdapter[logging.Logger]:
        """The stream's logger; its ``extra`` is :meth:`log_extra`."""

    def log_extra(self) -> dict[str, str]:
        """What the stream's log lines and spans carry (service, stream, ...)."""

    def clear(self, now: float) -> bool:
        """True if the next entry may be handed at ``now`` (``time.monotonic()``)
        without asking Redis or waiting: the hot path, once per entry, no await."""

    async def may_hand(self) -> bool:
        """When :meth:`clear` says no: may the next entry be handed to ``handle()``?
        (It may wait for a heartbeat, or read the lock.) False ends the batch."""

    async def may_retry(self) -> bool:
        """May the current entry be tried again, after a failure and its backoff?"""

    def holds(self) -> bool:
        """The stream is still this consumer's to act on: a dead letter may be written."""

    async def pause(self, delay_s: float) -> bool:
        """Sleep ``delay_s``; False if a stop or a loss ended it early."""

    def dead_letter(self, entry_id: str, fields: dict[str, str], failed: Failed) -> Pairs:
        """The fields of the entry's dead letter (``_deadletter.entry_dead_letter``)."""

    async def flush(self) -> None:
        """Send the acknowledgements of ``to_ack`` now."""


class DeadLetterSink(Protocol):
    """Where dead letters go: the gateway (or its in-memory fake)."""

    async def dead_letter_entry(self, fields: Pairs) -> tuple[str, int]: ...


Admission = Callable[[str, Any], Awaitable[Admit]]


class EntryPipeline:
    """What happens to an entry once read, for every consumer kind.

    Args:
        handle: the user's ``handle`` (a coroutine function or a plain function).
        config: ``handler_timeout_s``, ``max_handler_attempts`` and the backoff.
        metrics: where outcomes are counted.
        service: the service (a metrics label, and a span attribute).
        consumer: the consumer's name (a span attribute).
        group: the consumer group (a span attribute).
        dead_letters: where dead letters are written.
    """

    def __init__(
        self,
        handle: Callable[[Message[Any]], Awaitable[None] | None],
        *,
        config: PipelineConfig,
        metrics: MetricsRecorder,
        service: str,
        consumer: str,
        group: str,
        dead_letters: DeadLetterSink,
    ) -> None:
        self.call_handle = entry_caller(handle)
        self.config = config
        self.metrics = metrics
        self.service = service
        self.consumer = consumer
        self.group = group
        self.dead_letters = dead_letters

    def caller(self) -> Callable[[Message[Any]], Awaitable[None]]:
        """What calls ``handle()``: the user's function itself, unless a call has a time
        limit (``handler_timeout_s``) or a tracer provider is configured (a CONSUMER
        span per call, a child of the entry's trace). Looked up once per batch."""
        call = self.call_handle
        timeout_s = self.config.handler_timeout_s
        if timeout_s is not None:
            call = functools.partial(_call_within, call, timeout_s)
        tracer = _tracing.tracer()
        if tracer is not None:
            call = functools.partial(
                _tracing.handle_in_span, tracer, call, group=self.group, consumer=self.consumer
            )
        return call

    async def handle_batch(
        self,
        seat: Seat,
        batch: Sequence[tuple[str, Any]],
        admit: Admission | None = None,
    ) -> int:
        """Hand ``batch`` to ``handle()`` in order, each entry queued in ``seat.to_ack``
        once handled or dead-lettered. ``admit``, if given, is asked first for each
        entry (a redelivered entry's crash-loop count, say).

        Returns:
            How many entries of ``batch`` are done; fewer than all if the seat said
            stop (a loss, a stop, ``finish()``): the rest stay unacknowledged.
        """
        call = self.caller()
        stream, info = seat.stream, seat.info
        clear = seat.clear  # (looked up once: it runs once per entry)
        to_ack = seat.to_ack
        queue = to_ack.append
        flush_s = seat.ack_interval_s
        perf = time.perf_counter
        durations: list[float] = []
        record = durations.append
        done = 0  # entries before this one that are done
        # One clock read per entry: when the previous call returned is when this one
        # starts, and (through this batch's offset between the two clocks) what the
        # seat's hot check compares with its monotonic deadlines.
        started = perf()
        offset = time.monotonic() - started
        try:
            for done, (entry_id, fields) in enumerate(batch):  # noqa: B007
                if not clear(started + offset):
                    if not await seat.may_hand():
                        break
                    started = perf()
                if admit is not None:
                    verdict = await admit(entry_id, fields)
                    if verdict is Admit.STOP:
                        break
                    if verdict is Admit.SKIP:
                        started = perf()
                        continue
                try:
                    await call(Message(stream, entry_id, fields, info, 1))
                except Exception as exc:
                    outcome = await self._retry(seat, call, entry_id, fields, exc, started)
                    if outcome is None:
                        break
                    queue(entry_id)
                    started = perf()
                    if outcome is EntryOutcome.DEAD_LETTERED and flush_s is not None:
                        await seat.flush()  # so that no other consumer handles it again
                    continue
                now = perf()
                record(now - started)
                started = now
                queue(entry_id)
                if flush_s is not None and now - seat.last_flush > flush_s:
                    await seat.flush()
            else:
                done = len(batch)
        finally:
            if durations:
                self.metrics.entries_handled(self.service, EntryOutcome.OK, durations)
        return done

    async def _retry(
        self,
        seat: Seat,
        call: Callable[[Message[Any]], Awaitable[None]],
        entry_id: str,
        fields: Mapping[Any, Any],
        first: Exception,
        started: float,
    ) -> EntryOutcome | None:
        """Attempts 2.. of an entry whose first call, begun at ``started``
        (``time.perf_counter()``), raised ``first``.

        Returns:
            ``RETRIED`` or ``DEAD_LETTERED`` once the entry is done; None if the seat
            stopped first (the entry stays unacknowledged, for whoever holds it next).
        """
        cfg = self.config
        attempt, error = 1, first
        while True:
            self.metrics.handler_failed(self.service)
            step = after_failure(
                error,
                attempt,
                max_attempts=cfg.max_handler_attempts,
                backoff_s=cfg.handler_backoff_s,
                backoff_max_s=cfg.handler_backoff_max_s,
            )
            if isinstance(step, GiveUp):
                seat.log.warning(
                    "stream %r entry %s failed %d time(s) (%s): dead-lettering it",
                    seat.stream,
                    entry_id,
                    attempt,
                    step.error,
                )
                reason = (
                    DeadLetterReason.HANDLER_FAILED
                    if step.rejected is None
                    else DeadLetterReason.REJECTED
                )
                letter = seat.dead_letter(entry_id, text_fields(fields), Failed(attempt, step))
                if not await self.dead_letter(seat, entry_id, letter, reason, fields):
                    return None
                self._count(EntryOutcome.DEAD_LETTERED, started)
                return EntryOutcome.DEAD_LETTERED
            if not await seat.pause(step.delay_s) or not await seat.may_retry():
                return None
            attempt += 1
            try:
                await call(Message(seat.stream, entry_id, fields, seat.info, attempt))
            except Exception as exc:
                error = exc
                continue
            self._count(EntryOutcome.RETRIED, started)
            return EntryOutcome.RETRIED

    async def dead_letter(
        self,
        seat: Seat,
        entry_id: str,
        letter: Pairs,
        reason: DeadLetterReason,
        entry_fields: Mapping[Any, Any],
    ) -> bool:
        """Write a data entry's dead letter, retrying the write while the seat holds the
        stream; True once written, False if the seat stopped holding it first.

        The dead letter's span is a child of the entry's own trace (``entry_fields``).
        A second write for the same entry (a crash before its acknowledgement, or
        another consumer) finds the first one's marker and writes nothing."""
        backoff = Backoff()
        while True:
            if not seat.holds():
                return False
            try:
                _, trimmed = await self.dead_letters.dead_letter_entry(letter)
            except Exception as exc:
                self.metrics.loop_error(self.service, seat.loop)
                delay = backoff.next_delay()
                log_failure(seat.log, f"stream {seat.stream!r}: writing a dead letter", exc, delay)
                if not await seat.pause(delay):
                    return False
                continue
            self.metrics.dead_lettered(self.service, reason)
            if trimmed > 0:
                self.metrics.dlq_trimmed(self.service, trimmed)
            _tracing.mark(
                "streamjobs.dead_letter",
                {**seat.log_extra(), "entry_id": entry_id, "reason": reason.value},
                parent=entry_fields,
            )
            return True

    def _count(self, outcome: EntryOutcome, started: float) -> None:
        elapsed = time.perf_counter() - started
        self.metrics.entries_handled(self.service, outcome, (elapsed,))


class PipelineConfig(Protocol):
    """The settings the pipeline reads (``ConsumerConfig`` has them)."""

    @property
    def handler_timeout_s(self) -> float | None: ...
    @property
    def max_handler_attempts(self) -> int: ...
    @property
    def handler_backoff_s(self) -> float: ...
    @property
    def handler_backoff_max_s(self) -> float: ...
