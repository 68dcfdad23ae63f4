"""A runtime's liveness (docs/design.md#liveness): its session (incarnation, renewal,
end) under ``Liveness.SESSION``, the extension of its locks under ``Liveness.LOCK``,
and the heartbeat loops that do either."""

from __future__ import annotations

import time
from typing import Any

import anyio
import anyio.abc

from ._guard import log_failure
from ._ownership import CLEANUP_TIMEOUT_S
from ._runtime_state import (
    RuntimeState,
    log,
)


class RuntimeLiveness(RuntimeState):
    """Sessions, lock extension and the heartbeat."""

    async def _touch_session(self) -> None:
        """Renew this consumer's session key (one lock TTL): what tells operators, and
        the pruning of consumer names, that it is alive; under ``Liveness.SESSION``
        also what keeps its locks valid."""
        if self.session_mode:
            await self._renew_session()
            return
        try:
            await self.gateway.touch_session(
                self.name, self._session_value, self.config.lock_ttl_ms
            )
        except Exception as exc:
            self.metrics.loop_error(self.service, "heartbeat")
            log_failure(log, "renewing the consumer session", exc, 0.0)

    async def _forget_stop(self) -> None:
        """A consumer name that starts again (a fixed ``consumer_name``) is no longer
        one that stopped. Best effort: the record is for ``status`` only."""
        try:
            await self.gateway.record_stop(self.name, False)
        except Exception as exc:
            log_failure(log, "clearing the consumer's stop record", exc, 0.0)

    async def _end_session(self) -> None:
        with anyio.CancelScope(shield=True), anyio.move_on_after(CLEANUP_TIMEOUT_S):
            try:
                if self.session_mode:
                    if self.session_confirmed_at is not None:
                        await self.gateway.session(
                            "end",
                            self.name,
                            self._session_value,
                            self.config.lock_ttl_ms,
                            self._incarnation,
                        )
                    self.session_confirmed_at = None
                else:
                    await self.gateway.end_session(self.name)
                await self.gateway.record_stop(self.name, True)
            except Exception as exc:
                log_failure(log, "ending the consumer session", exc, 0.0)

    def _session_live(self) -> bool:
        at = self.session_confirmed_at
        cfg = self.config
        return at is not None and time.monotonic() < at + cfg.lock_ttl_s - cfg.margin_s

    async def _renew_session(self) -> bool:
        """Create or renew the session (``Liveness.SESSION``); True if it is live now.

        A session found expired or replaced is never renewed: every stream it held is
        lost (recovery may already have given its lock to someone else), and the next
        call starts a new incarnation.
        """
        cfg = self.config
        live = [o for o in self.owned.values() if not o.lost]
        mode: Any = "create" if self.session_confirmed_at is None else "renew"
        sent = time.monotonic()
        try:
            ok = await self.gateway.session(
                mode, self.name, self._session_value, cfg.lock_ttl_ms, self._incarnation
            )
        except Exception as exc:
            self.metrics.heartbeat(self.service, False)
            log_failure(log, "renewing the consumer session", exc, 0.0)
            for o in live:
                o.heartbeat_failed()
            return False
        if not ok:
            self.metrics.heartbeat(self.service, False)
            log.warning(
                "the session of consumer %r expired or was replaced (a stall past the "
                "lock TTL?): its %d streams are lost; starting a new session",
                self.name,
                len(live),
            )
            self.session_confirmed_at = None
            self._new_incarnation()
            for o in live:
                if not o.ending and self.owned.get(o.stream) is o:
                    o.mark_lost()
            return False
        self.session_confirmed_at = sent
        changed, self._session_changed = self._session_changed, anyio.Event()
        changed.set()
        self.metrics.heartbeat(self.service, True)
        for o in live:
            o.renew(sent)
        return True

    async def _wait_for_session(self) -> None:
        """Intake under ``Liveness.SESSION`` takes nothing without a live session: a
        lock naming a session that does not exist would be taken over at once."""
        while self.session_mode and not self._session_live() and not self._draining:
            with anyio.move_on_after(min(self.config.heartbeat_s, 1.0)):
                await self._session_changed.wait()

    async def _session_heartbeat_loop(self) -> None:
        cfg = self.config
        retry_s = min(cfg.heartbeat_s, 0.5)
        delay = cfg.heartbeat_s
        while True:
            await anyio.sleep(delay)
            if not await self._renew_session():
                delay = retry_s
                continue
            delay = cfg.heartbeat_s
            try:
                await self._extend_due_locks()
            except Exception as exc:
                self.metrics.loop_error(self.service, "heartbeat")
                log_failure(log, "extending locks", exc, 0.0)

    async def _extend_due_locks(self) -> None:
        """Under ``Liveness.SESSION``, extend the locks whose long TTL
        (``session_lock_ttl_ms``) is a third gone: a few per heartbeat, not all."""
        ttl_ms = self.lock_ttl_ms
        now = time.monotonic()
        due = [
            o
            for o in self.owned.values()
            if not o.lost
            and o.acquired
            and not o.lock_cut
            and now - o.lock_extended_at >= ttl_ms / 3000
        ]
        if not due:
            return
        results = await self.gateway.extend_many([(o.stream, o.token) for o in due], ttl_ms)
        renewed = []
        for o, extended in zip(due, results, strict=True):
            if extended:
                o.lock_extended_at = now
                renewed.append(o.assignment.id)
            elif extended is False and not o.ending and self.owned.get(o.stream) is o:
                o.mark_lost()
        await self.gateway.record_leases(renewed, ttl_ms, new=False)

    async def _heartbeat_loop(self) -> None:
        if self.session_mode:
            await self._session_heartbeat_loop()
            return
        cfg = self.config
        retry_s = min(cfg.heartbeat_s, 0.5)
        delay = cfg.heartbeat_s
        while True:
            await anyio.sleep(delay)
            await self._touch_session()
            live = [o for o in self.owned.values() if not o.lost]
            if not live:
                delay = cfg.heartbeat_s
                continue
            sent = time.monotonic()
            try:
                results = await self.gateway.extend_many(
                    [(o.stream, o.token) for o in live], cfg.lock_ttl_ms
                )
            except Exception as exc:
                # Tolerated up to the TTL: the local lease stops handing entries once it
                # lapses, and an extend that succeeds later proves nobody took over.
                self.metrics.heartbeat(self.service, False)
                log_failure(log, "heartbeat", exc, retry_s)
                delay = retry_s
                for o in live:
                    o.heartbeat_failed()
                continue
            partial = None in results
            self.metrics.heartbeat(self.service, not partial)
            delay = retry_s if partial else cfg.heartbeat_s
            renewed = []
            for o, extended in zip(live, results, strict=True):
                if extended:
                    o.renew(sent)
                    renewed.append(o.assignment.id)
                elif extended is None:
                    o.heartbeat_failed()  # its node was away: try again soon
                elif not o.ending and self.owned.get(o.stream) is o:
                    # A stream that finished meanwhile released its own lock: that is
                    # not a loss.
                    o.mark_lost()
            try:
                await self.gateway.record_leases(renewed, cfg.lock_ttl_ms, new=False)
            except Exception as exc:
                self.metrics.loop_error(self.service, "heartbeat")
                log_failure(log, "recording leases", exc, 0.0)
