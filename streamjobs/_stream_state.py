"""The state of one owned stream, and what the runtime calls on it: the base of
:class:`~streamjobs._ownership.OwnedStream` (its life is in ``_ownership``, its
acquisition in ``_stream_acquire``, its endings in ``_stream_end``)."""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

import anyio
import anyio.to_thread

from . import _tracing
from ._idle import IdleWait
from ._pipeline import EntryPipeline, Hooks
from ._recovery import Recoverer
from ._redis._protocol import StreamGateway
from ._redis._replies import ReadReply
from ._wire import Assignment
from .config import ClusterMode, ConsumerConfig
from .exceptions import (
    ScriptError,
    WrongKeyType,
)
from .metrics import MetricsRecorder, StreamEvent

log = logging.getLogger("streamjobs._ownership")  # one logger for the parts of an owned stream

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


class Host(Protocol):
    """The consumer runtime, as one of its streams sees it."""

    gateway: StreamGateway
    recoverer: Recoverer
    config: ConsumerConfig
    cluster_mode: ClusterMode
    """``NONE``: every key is on one server, so a script may span slots."""
    metrics: MetricsRecorder
    hooks: Hooks
    pipeline: EntryPipeline
    """What hands each entry to ``hooks.handle`` (retries, dead letters, counts)."""
    service: str
    name: str
    entry_size_hint: int
    """Bytes of the largest entry in the last batch any stream read: sizes first reads."""

    @property
    def waiter(self) -> IdleWait | None:
        """The shared idle wait (blocking reads on a standalone server, keyspace events
        on an OSS cluster), or None: each stream blocks on a read of its own."""

    @property
    def session_confirmed_at(self) -> float | None:
        """Under ``Liveness.SESSION``: when (monotonic) the call that last renewed the
        session was sent, or None while there is no live session; under
        ``Liveness.LOCK`` always None. Each lock then lives as long as the session."""

    @property
    def lock_ttl_ms(self) -> int:
        """The TTL locks are taken and extended with (docs/design.md#liveness)."""

    def lock_token(self) -> str:
        """A fresh token for a stream's lock."""

    async def take_lease(self, assignment_id: str) -> bool:
        """Whether the assignment is still pending with this consumer; if it is, its
        lease is recorded. The stream tasks of one intake read share one call."""

    @property
    def draining(self) -> bool:
        """Shutdown began: hand no more entries to ``handle()``."""

    def adopt(self, stream: OwnedStreamState) -> None:
        """``stream`` now holds its lock."""

    def disown(self, stream: OwnedStreamState) -> None:
        """``stream`` no longer holds its lock (finished, lost or handed back)."""

    def spawn(self, fn: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run ``fn`` in the background, outliving the stream's own task."""


class Outcome(enum.Enum):
    FINISHED = "finished"
    SETTLED = "settled"  # dead-lettered, or re-queued with a retry: nothing left to do
    LOST = "lost"
    STOPPED = "stopped"  # shutdown, cancellation, or a lock held by someone else


class OwnedStreamState:
    """One assignment's stream: its state, and the calls the runtime makes on it."""

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
        self.ending = False
        """The end was reached (marker or ``finish()``): it completes, or is lost."""
        self.eos_ids: list[str] = []
        self.completed = False  # a finish call of ours deleted the assignment
        self.sealed = False  # the final acks and the retention are written
        self.reply_lost = False  # a completion call failed: it may have been done
        self.lock_cut = False
        """The lock was cut to the short TTL (``lock_ttl_s``) because the assignment is
        about to go: the session heartbeat must not lengthen it again."""
        self.unusable: Exception | None = None  # a permanent error about the data stream
        self.contended = False  # its lock stayed someone else's for a heartbeat interval
        self.acquire_error: str | None = None  # the last error of a failed acquire
        self.job_ended = False  # acquired, but the job had ended early: only complete it
        self.stale = False  # the assignment was no longer ours when we came to it
        self.first_read: ReadReply | None = None
        """The first read, made with the acquisition (``Gateway.acquire_and_read``),
        until the stream's processing takes it."""
        self.handling = False  # in a batch of handle() calls (statistics)
        self.cancel_reason: str | None = None  # Producer.cancel_stream's reason
        # Created only when someone waits on this stream's state: an idle stream
        # holds none (an event and its deque cost about 1 KiB, per stream).
        self._changed: anyio.Event | None = None
        self.scope = anyio.CancelScope()
        self.wait_scope: anyio.CancelScope | None = None
        self.idle_wake: asyncio.Future[None] | None = None
        """What ends this stream's wait on the shared idle wait, while it waits."""
        self._log: logging.LoggerAdapter[logging.Logger] | None = None

    @property
    def stream(self) -> str:
        return self.assignment.stream

    def first_count(self) -> int:
        """Entries to read first: sized by the largest entry the consumer saw last."""
        return self.count_for(self.host.entry_size_hint)

    def count_for(self, entry_bytes: int) -> int:
        cfg = self.host.config
        return max(1, min(cfg.read_batch_size, cfg.read_batch_bytes // max(1, entry_bytes)))

    @property
    def log(self) -> logging.LoggerAdapter[logging.Logger]:
        """This stream's logger: every line carries ``log_extra()`` as its ``extra``.
        Built on first use: most streams never log, and an adapter with its ``extra``
        costs about 0.3 KiB per stream."""
        adapter = self._log
        if adapter is None:
            adapter = self._log = logging.LoggerAdapter(log, self.log_extra())
        return adapter

    # -- called by the runtime -------------------------------------------------------

    def clear(self, now: float) -> bool:
        """True if the next entry may be handed at ``now`` (monotonic) with no await:
        the lock was proved ours within ``RECHECK_AFTER_S``, the local lease is valid,
        and nothing (a loss, shutdown, ``finish()``) ends the batch."""
        return not (self.lost or self.host.draining or self.finish_requested) and (
            now < self.check_at
        )

    def renew(self, confirmed_at: float) -> None:
        """The lock was (re)confirmed by a call sent at ``confirmed_at`` (monotonic)."""
        cfg = self.host.config
        self.lease_deadline = confirmed_at + cfg.lock_ttl_s - cfg.margin_s
        self.confirmed(confirmed_at)
        self.notify()

    def confirmed(self, sent_at: float) -> None:
        """A call sent at ``sent_at`` found the lock ours (it did not extend it)."""
        self.check_at = min(self.lease_deadline, max(self.check_at, sent_at + RECHECK_AFTER_S))

    def heartbeat_failed(self) -> None:
        """Wake waiters, so a lapsed lease is noticed."""
        self.notify()

    def interrupt(self) -> None:
        """Shutdown began: stop waiting for entries and stop after the current one."""
        self.end_wait()
        self.notify()

    def request_finish(self) -> None:
        """``finish()``: end after the current entry, or now if waiting for entries."""
        self.finish_requested = True
        self.end_wait()

    def cancel(self) -> None:
        """The grace period is over: cancel whatever runs (the hand-back still runs)."""
        self.scope.cancel()

    def mark_lost(self) -> None:
        """The lock is gone or someone else's: stop at once, ack nothing, tell the user."""
        if self.lost:
            return
        self.lost = True
        self.to_ack = []  # a disowned consumer acks nothing
        self.end_wait()
        self.notify()
        host = self.host
        host.metrics.stream_event(host.service, StreamEvent.LOST)
        self.log.warning("lost stream %r (lock expired or taken over)", self.stream)
        _tracing.mark("streamjobs.stream_lost", self.log_extra())
        # Reported now, not when the in-flight handler returns (it may run for long).
        host.spawn(self._report_lost)

    def end_wait(self) -> None:
        """End the stream's wait for entries, if it waits (shutdown, finish, loss)."""
        if self.wait_scope is not None:
            self.wait_scope.cancel()
        wake = self.idle_wake
        if wake is not None and not wake.done():
            wake.set_result(None)

    def notify(self) -> None:
        """Wake every waiter on this stream's state (lease, lost, shutdown)."""
        changed, self._changed = self._changed, None
        if changed is not None:
            changed.set()

    def state_changed(self) -> anyio.Event:
        """The event the next ``_notify`` sets."""
        if self._changed is None:
            self._changed = anyio.Event()
        return self._changed

    def stopping(self) -> bool:
        return self.lost or self.host.draining

    def log_extra(self) -> dict[str, str]:
        """The ``extra`` of this stream's log lines (structured loggers pick them up)."""
        return {
            "service": self.host.service,
            "consumer": self.host.name,
            "stream": self.stream,
            "assignment_id": self.assignment.id,
        }

    async def pause(self, delay_s: float) -> bool:
        """Sleep ``delay_s`` unless the stream is lost or shutdown starts; True if it slept."""
        deadline = time.monotonic() + delay_s
        while True:
            changed = self.state_changed()
            if self.stopping():
                return False
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return True
            with anyio.move_on_after(remaining):
                await changed.wait()

    async def _report_lost(self) -> None:
        with anyio.move_on_after(CLEANUP_TIMEOUT_S):
            try:
                await self.host.hooks.on_stream_lost(self.stream)
            except Exception:
                self.log.exception("on_stream_lost(%r) raised", self.stream)
