"""A consumer's liveness (docs/design.md#liveness): its session (incarnation, renewal,
end) under ``Liveness.SESSION``, the extension of its locks under ``Liveness.LOCK``,
and the heartbeat loops that do either. :class:`Heartbeat` is held by the runtime."""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import time
from typing import Any, Protocol

import anyio
import anyio.abc

from ._guard import log_failure
from ._redis._protocol import StreamGateway
from ._session import new_incarnation, session_token
from ._stream_state import CLEANUP_TIMEOUT_S, OwnedStreamState
from .config import ConsumerConfig
from .config import Liveness as LivenessMode
from .metrics import MetricsRecorder

log = logging.getLogger("streamjobs._runtime")


class HeartbeatHost(Protocol):
    """The runtime, as its liveness sees it."""

    gateway: StreamGateway
    config: ConsumerConfig
    metrics: MetricsRecorder
    service: str
    name: str
    owned: dict[str, OwnedStreamState]

    @property
    def draining(self) -> bool: ...

    @property
    def lock_ttl_ms(self) -> int: ...


class Heartbeat:
    """Sessions, lock extension and the heartbeat of one consumer (its runtime holds
    one).

    Args:
        host: the runtime: its streams (``owned``), settings, gateway and metrics.
    """

    def __init__(self, host: HeartbeatHost) -> None:
        self.host = host
        self.session_mode = host.config.liveness is LivenessMode.SESSION
        self.confirmed_at: float | None = None
        """Under ``Liveness.SESSION``: when (monotonic) the call that last renewed the
        session was sent, or None while there is no live session; under
        ``Liveness.LOCK`` always None."""
        self._changed = anyio.Event()
        self.new_incarnation()

    def new_incarnation(self) -> None:
        """A new session identity: at each start, and after a session was found dead."""
        self.incarnation = new_incarnation()
        self._value = json.dumps(
            {
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "started_at": time.time(),
                "incarnation": self.incarnation,
            }
        )

    def lock_token(self) -> str:
        """A fresh token for a stream's lock: one naming the session under
        ``Liveness.SESSION``, else the consumer's name and random digits."""
        host = self.host
        if self.session_mode:
            return session_token(self.incarnation, host.name, host.service)
        return f"{host.name}:{secrets.token_hex(8)}"

    async def touch_session(self) -> None:
        """Renew this consumer's session key (one lock TTL): what tells operators, and
        the pruning of consumer names, that it is alive; under ``Liveness.SESSION``
        also what keeps its locks valid."""
        if self.session_mode:
            await self.renew_session()
            return
        try:
            await self.host.gateway.liveness.touch_session(
                self.host.name, self._value, self.host.config.lock_ttl_ms
            )
        except Exception as exc:
            self.host.metrics.loop_error(self.host.service, "heartbeat")
            log_failure(log, "renewing the consumer session", exc, 0.0)

    async def forget_stop(self) -> None:
        """A consumer name that starts again (a fixed ``consumer_name``) is no longer
        one that stopped. Best effort: the record is for ``status`` only."""
        try:
            await self.host.gateway.liveness.record_stop(self.host.name, False)
        except Exception as exc:
            log_failure(log, "clearing the consumer's stop record", exc, 0.0)

    async def end_session(self) -> None:
        with anyio.CancelScope(shield=True), anyio.move_on_after(CLEANUP_TIMEOUT_S):
            try:
                if self.session_mode:
                    if self.confirmed_at is not None:
                        await self.host.gateway.liveness.session(
                            "end",
                            self.host.name,
                            self._value,
                            self.host.config.lock_ttl_ms,
                            self.incarnation,
                        )
                    self.confirmed_at = None
                else:
                    await self.host.gateway.liveness.end_session(self.host.name)
                await self.host.gateway.liveness.record_stop(self.host.name, True)
            except Exception as exc:
                log_failure(log, "ending the consumer session", exc, 0.0)

    def session_live(self) -> bool:
        at = self.confirmed_at
        cfg = self.host.config
        return at is not None and time.monotonic() < at + cfg.lock_ttl_s - cfg.margin_s

    async def renew_session(self) -> bool:
        """Create or renew the session (``Liveness.SESSION``); True if it is live now.

        A session found expired or replaced is never renewed: every stream it held is
        lost (recovery may already have given its lock to someone else), and the next
        call starts a new incarnation.
        """
        cfg = self.host.config
        live = [o for o in self.host.owned.values() if not o.lost]
        mode: Any = "create" if self.confirmed_at is None else "renew"
        sent = time.monotonic()
        try:
            ok = await self.host.gateway.liveness.session(
                mode, self.host.name, self._value, cfg.lock_ttl_ms, self.incarnation
            )
        except Exception as exc:
            self.host.metrics.heartbeat(self.host.service, False)
            log_failure(log, "renewing the consumer session", exc, 0.0)
            for o in live:
                o.heartbeat_failed()
            return False
        if not ok:
            self.host.metrics.heartbeat(self.host.service, False)
            log.warning(
                "the session of consumer %r expired or was replaced (a stall past the "
                "lock TTL?): its %d streams are lost; starting a new session",
                self.host.name,
                len(live),
            )
            self.confirmed_at = None
            self.new_incarnation()
            for o in live:
                if not o.ending and self.host.owned.get(o.stream) is o:
                    o.mark_lost()
            return False
        self.confirmed_at = sent
        changed, self._changed = self._changed, anyio.Event()
        changed.set()
        self.host.metrics.heartbeat(self.host.service, True)
        for o in live:
            o.renew(sent)
        return True

    async def wait_for_session(self) -> None:
        """Intake under ``Liveness.SESSION`` takes nothing without a live session: a
        lock naming a session that does not exist would be taken over at once."""
        while self.session_mode and not self.session_live() and not self.host.draining:
            with anyio.move_on_after(min(self.host.config.heartbeat_s, 1.0)):
                await self._changed.wait()

    async def _session_heartbeat_loop(self) -> None:
        cfg = self.host.config
        retry_s = min(cfg.heartbeat_s, 0.5)
        delay = cfg.heartbeat_s
        while True:
            await anyio.sleep(delay)
            if not await self.renew_session():
                delay = retry_s
                continue
            delay = cfg.heartbeat_s
            try:
                await self._extend_due_locks()
            except Exception as exc:
                self.host.metrics.loop_error(self.host.service, "heartbeat")
                log_failure(log, "extending locks", exc, 0.0)

    async def _extend_due_locks(self) -> None:
        """Under ``Liveness.SESSION``, extend the locks whose long TTL
        (``session_lock_ttl_ms``) is a third gone: a few per heartbeat, not all."""
        ttl_ms = self.host.lock_ttl_ms
        now = time.monotonic()
        due = [
            o
            for o in self.host.owned.values()
            if not o.lost
            and o.acquired
            and not o.lock_cut
            and now - o.lock_extended_at >= ttl_ms / 3000
        ]
        if not due:
            return
        results = await self.host.gateway.streams.extend_many(
            [(o.stream, o.token) for o in due], ttl_ms
        )
        renewed = []
        for o, extended in zip(due, results, strict=True):
            if extended:
                o.lock_extended_at = now
                renewed.append(o.assignment.id)
            elif extended is False and not o.ending and self.host.owned.get(o.stream) is o:
                o.mark_lost()
        await self.host.gateway.streams.record_leases(renewed, ttl_ms, new=False)

    async def heartbeat_loop(self) -> None:
        if self.session_mode:
            await self._session_heartbeat_loop()
            return
        cfg = self.host.config
        retry_s = min(cfg.heartbeat_s, 0.5)
        delay = cfg.heartbeat_s
        while True:
            await anyio.sleep(delay)
            await self.touch_session()
            live = [o for o in self.host.owned.values() if not o.lost]
            if not live:
                delay = cfg.heartbeat_s
                continue
            sent = time.monotonic()
            try:
                results = await self.host.gateway.streams.extend_many(
                    [(o.stream, o.token) for o in live], cfg.lock_ttl_ms
                )
            except Exception as exc:
                # Tolerated up to the TTL: the local lease stops handing entries once it
                # lapses, and an extend that succeeds later proves nobody took over.
                self.host.metrics.heartbeat(self.host.service, False)
                log_failure(log, "heartbeat", exc, retry_s)
                delay = retry_s
                for o in live:
                    o.heartbeat_failed()
                continue
            partial = None in results
            self.host.metrics.heartbeat(self.host.service, not partial)
            delay = retry_s if partial else cfg.heartbeat_s
            renewed = []
            for o, extended in zip(live, results, strict=True):
                if extended:
                    o.renew(sent)
                    renewed.append(o.assignment.id)
                elif extended is None:
                    o.heartbeat_failed()  # its node was away: try again soon
                elif not o.ending and self.host.owned.get(o.stream) is o:
                    # A stream that finished meanwhile released its own lock: that is
                    # not a loss.
                    o.mark_lost()
            try:
                await self.host.gateway.streams.record_leases(renewed, cfg.lock_ttl_ms, new=False)
            except Exception as exc:
                self.host.metrics.loop_error(self.host.service, "heartbeat")
                log_failure(log, "recording leases", exc, 0.0)
