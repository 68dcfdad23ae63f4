"""Taking a stream: the check that the assignment is still ours with its lease, then
its lock (from a dead session's holder too)."""

from __future__ import annotations

import logging
import time

import anyio
import anyio.to_thread

from ._backoff import Backoff
from ._guard import log_failure
from ._redis._boundary import ACQUIRED_ENDED, NOT_ACQUIRED
from ._session import parse_session_token
from ._stream_state import (
    PERMANENT,
    OwnedStreamState,
    log,
)
from .metrics import StreamEvent


class Acquisition:
    """Acquiring one assignment's stream (its ``OwnedStream`` holds one)."""

    def __init__(self, s: OwnedStreamState) -> None:
        self.s = s

    async def acquire(self) -> bool:
        """Take the lock; False (to hand the assignment back) if someone holds it.

        A lock that names a dead session (``Liveness.SESSION``, whichever liveness this
        consumer uses) is replaced: the session never comes back, so its owner can
        neither renew it nor pass a fenced call again.
        """
        host, cfg = self.s.host, self.s.host.config
        if not await self._still_assigned():
            return False
        backoff = Backoff(base_s=0.05, cap_s=cfg.heartbeat_s)
        give_up_at = time.monotonic() + cfg.heartbeat_s
        replace = ""
        first_try = True
        while not host.draining:
            sent = time.monotonic()
            try:
                if first_try:
                    # The lock and the first read in one round trip. Only once: a read
                    # queued behind an acquire that fails still delivers entries (to
                    # be claimed by the owner), so a contended retry goes alone.
                    first_try = False
                    taken, self.s.first_read = await host.gateway.streams.acquire_and_read(
                        self.s.stream,
                        self.s.token,
                        host.lock_ttl_ms,
                        self.s.assignment.first_id,
                        host.name,
                        self.s.first_count(),
                    )
                else:
                    taken = await host.gateway.streams.acquire(
                        self.s.stream,
                        self.s.token,
                        host.lock_ttl_ms,
                        replace,
                        self.s.assignment.first_id,
                    )
                if taken != NOT_ACQUIRED:
                    self.s.acquired = True
                    # The job ended early and its owner died before completing it.
                    self.s.job_ended = taken == ACQUIRED_ENDED
                    self.s.lock_extended_at = sent
                    session_at = host.session_confirmed_at
                    self.s.renew(sent if session_at is None else min(sent, session_at))
                    host.adopt(self.s)
                    host.metrics.stream_event(host.service, StreamEvent.ACQUIRED)
                    if log.isEnabledFor(logging.DEBUG):
                        self.s.log.debug("acquired stream %r", self.s.stream)
                    await self._report_recovery()
                    return True
                replace = await self._dead_holder()
                if replace and time.monotonic() < give_up_at:
                    continue
            except PERMANENT as exc:
                self.s.unusable = exc
                return False
            except Exception as exc:
                self.s.acquire_error = f"{type(exc).__name__}: {exc}"
                host.metrics.loop_error(host.service, "acquire")
                log_failure(self.s.log, f"stream {self.s.stream!r}: acquire", exc, 0.0)
            if time.monotonic() >= give_up_at:
                host.metrics.stream_event(host.service, StreamEvent.CONTENDED)
                self.s.contended = True
                return False
            # Usually a graceful hand-back whose unlock is a moment behind its re-queue.
            await anyio.sleep(backoff.next_delay())
        return False

    async def _dead_holder(self) -> str:
        """The token holding the lock if it names a dead session, else ''."""
        _, dead = await self.s.host.gateway.liveness.lock_state(self.s.stream)
        parsed = None if dead is None else parse_session_token(dead)
        if dead is None or parsed is None:
            return ""
        self.s.log.info(
            "stream %r: its lock names the dead session of %r: taking it over",
            self.s.stream,
            parsed.consumer,
        )
        return dead

    async def _report_recovery(self) -> None:
        """A recovered assignment (it carries ``_lost_at``): report how long the stream
        went without an owner, on the server's clock."""
        lost_at_ms = self.s.assignment.lost_at_ms
        if lost_at_ms is None:
            return
        host = self.s.host
        try:
            now_ms = await host.gateway.assignments.server_time_ms()
        except Exception:
            return  # only a metric is lost
        seconds = max(0, now_ms - lost_at_ms) / 1000
        host.metrics.recovery_latency(host.service, seconds)
        self.s.log.info(
            "resumed stream %r %.2fs after its previous owner was lost (retry %d)",
            self.s.stream,
            seconds,
            self.s.assignment.retry_count,
        )

    async def _still_assigned(self) -> bool:
        """False if the assignment is no longer pending with this consumer; if it is,
        its lease is recorded (one call for all of an intake read's assignments).

        A consumer stalled between reading an assignment and taking its lock (a GC
        pause, a frozen VM) may find that recovery re-queued it meanwhile, and that
        another consumer ran the copy: taking the lock now would run a finished job
        again. If Redis cannot say, the job goes on without a lease record: a stream
        whose end was already handled is recognised after the first read (see
        ``_process``), and a crash is still found, by the XPENDING scan after
        ``min_idle_s`` instead of the lease sweep.
        """
        host = self.s.host
        try:
            ours = await host.take_lease(self.s.assignment.id)
        except Exception as exc:
            host.metrics.loop_error(host.service, "acquire")
            log_failure(self.s.log, f"stream {self.s.stream!r}: checking its assignment", exc, 0.0)
            return True
        if ours:
            return True
        self.s.log.warning(
            "assignment %s of stream %r was re-queued or finished while this consumer "
            "was stalled: dropping it",
            self.s.assignment.id,
            self.s.stream,
        )
        self.s.stale = True
        return False
