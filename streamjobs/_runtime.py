"""The consumer runtime: every piece of a running consumer but the user's code.

A :class:`Runtime` belongs to one ``StreamConsumer`` and owns its state and its
background work, all in one anyio task group:

* intake: XREADGROUP on the assignment stream for as many assignments as there are
  free slots (short BLOCK, so stopping is prompt), one :class:`OwnedStream` task each;
* heartbeat: under ``Liveness.LOCK``, extend every owned lock in one round trip
  (compare-and-set on the token), renew each stream's local lease, and record the new
  deadlines in the lease index; under ``Liveness.SESSION``, renew the session key
  (compare-and-set on its value) and with it every local lease, and extend only the
  locks whose long TTL is a third gone (docs/design.md#liveness);
* recovery (``_recovery_loops``): keyspace expiry events, the lease sweep and the
  XPENDING reconciliation scan.

Shutdown is two-phase (docs/design.md#finishing-and-hand-back): stop intake, let
in-flight handlers finish within ``shutdown_grace_s``, then cancel them; every
unfinished stream is handed back (re-queued without counting a retry, then
unlocked) in a shielded, bounded step.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import socket
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import anyio
import anyio.abc

from ._guard import LoopGuard, log_failure
from ._ownership import CLEANUP_TIMEOUT_S, Hooks, OwnedStream, entry_caller
from ._recovery import Recoverer
from ._recovery_loops import RecoveryLoops
from ._redis import REDIS_FAILURES, Gateway, RawFields, StreamGateway, eviction_policies
from ._session import new_incarnation, session_token
from ._stats import ConsumerStatistics, Tally
from ._stream_state import StreamState
from ._waiter import Waiter
from ._wire import parse_assignment
from .config import ClusterMode, ConsumerConfig, Liveness, RecoveryConfig
from .exceptions import (
    ConfigurationError,
    InvalidAssignment,
    NoSuchGroup,
    PermissionDenied,
    RedisUnavailable,
    StreamJobsError,
)
from .metrics import MetricsRecorder, NullRecorder, RequeueOutcome, complete

log = logging.getLogger(__name__)

PULSE_S = 1.0
"""How often the pulse loop turns, and how long Redis may be silent before a PING."""
READY_WITHIN_S = 5.0
"""Ready only if a command got a reply this recently."""
HEALTHY_WITHIN_S = 10.0
"""Healthy only if the pulse loop turned this recently (the event loop is not stuck)."""


class Runtime:
    """The running machinery of one consumer. Constructing it does no I/O.

    Args:
        hooks: the user's ``handle()`` and hooks.
        gateway: the Redis commands (or a fake of them).
        client: the Redis client, for keyspace subscriptions (unused in PROXY mode).
        name: the consumer's name in the consumer groups.
    """

    def __init__(
        self,
        hooks: Hooks,
        gateway: StreamGateway,
        *,
        client: Any,
        name: str,
        config: ConsumerConfig,
        recovery: RecoveryConfig,
        cluster_mode: ClusterMode,
        metrics: MetricsRecorder,
    ) -> None:
        self.hooks = hooks
        self.call_handle = entry_caller(hooks.handle)
        self.gateway = gateway
        self.client = client
        self.config = config
        self.tally = Tally(complete(metrics))
        self.metrics: MetricsRecorder = self.tally
        # Sampling the queue is for a recorder's gauges: not done for the default one.
        self._sampled = type(metrics) is not NullRecorder
        self.name = name
        self.service = gateway.keys.service
        self.cluster_mode = cluster_mode
        self.recoverer = Recoverer(
            gateway,
            max_retries=recovery.max_retries,
            metrics=self.metrics,
            service=self.service,
            consumer=name,
        )
        self.loops = RecoveryLoops(
            client,
            gateway,
            self.recoverer,
            recovery=recovery,
            consumer=config,
            cluster_mode=cluster_mode,
            metrics=self.metrics,
            name=name,
        )
        self.owned: dict[str, StreamState] = {}
        self.entry_size_hint = config.read_batch_bytes  # unknown: read one entry first
        self.waiter = (
            Waiter(
                client,
                gateway,
                block_ms=config.read_block_ms,
                metrics=self.metrics,
                service=self.service,
                streams=config.max_concurrent_streams,
            )
            if cluster_mode is ClusterMode.NONE and client is not None
            else None
        )
        self._streams: set[OwnedStream] = set()  # acquiring, owned, or handing back
        self._slot_freed = anyio.Event()
        self._all_done = anyio.Event()
        self._all_done.set()
        self._stop = anyio.Event()
        self._intake_done = anyio.Event()
        self._stopped = anyio.Event()
        self._ready = anyio.Event()
        self._draining = False
        self.running = False
        self._pulse_at = 0.0  # monotonic time of the pulse loop's last turn
        self.session_mode = config.liveness is Liveness.SESSION
        self.session_confirmed_at: float | None = None
        self._session_changed = anyio.Event()
        self._new_incarnation()
        self._group_missing = False  # intake's last read found no group
        self._streams_tg: anyio.abc.TaskGroup | None = None
        self._cm_tg: anyio.abc.TaskGroup | None = None

    # -- what OwnedStream needs (the Host protocol) --------------------------------------

    @property
    def draining(self) -> bool:
        return self._draining

    @property
    def lock_ttl_ms(self) -> int:
        cfg = self.config
        return cfg.session_lock_ttl_ms if self.session_mode else cfg.lock_ttl_ms

    def lock_token(self) -> str:
        if self.session_mode:
            return session_token(self._incarnation, self.name, self.service)
        return f"{self.name}:{secrets.token_hex(8)}"

    def _new_incarnation(self) -> None:
        """A new session identity: at start, and after a session was found dead."""
        self._incarnation = new_incarnation()
        self._session_value = json.dumps(
            {
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "started_at": time.time(),
                "incarnation": self._incarnation,
            }
        )

    def adopt(self, stream: StreamState) -> None:
        previous = self.owned.get(stream.stream)
        if previous is not None and previous is not stream:
            # This consumer took the stream again (it stalled past its TTL and then
            # read its own re-queued assignment): the new lock proves the old one gone.
            previous.mark_lost()
        self.owned[stream.stream] = stream
        self.metrics.owned_streams(self.service, len(self.owned))

    def disown(self, stream: StreamState) -> None:
        if self.owned.get(stream.stream) is stream:
            del self.owned[stream.stream]
            self.metrics.owned_streams(self.service, len(self.owned))

    def spawn(self, fn: Callable[[], Coroutine[Any, Any, None]]) -> None:
        assert self._streams_tg is not None
        self._streams_tg.start_soon(fn)

    # -- public operations (StreamConsumer delegates here) -------------------------------

    def owned_streams(self) -> frozenset[str]:
        return frozenset(s for s, o in self.owned.items() if not o.lost)

    async def wait_ready(self) -> None:
        await self._ready.wait()

    def health(self) -> tuple[bool, str]:
        """Liveness: running, with an event loop that turned within
        ``HEALTHY_WITHIN_S``. Safe to call from another thread (reads numbers only)."""
        if not (self.running and self._ready.is_set()):
            return False, "not running"
        silent_s = time.monotonic() - self._pulse_at
        if silent_s >= HEALTHY_WITHIN_S:
            return False, f"event loop stuck: no turn for {silent_s:.1f}s"
        return True, "ok"

    def readiness(self) -> tuple[bool, str]:
        """Readiness: healthy, Redis answered within ``READY_WITHIN_S``, and the
        assignment group exists. Safe to call from another thread."""
        ok, why = self.health()
        if not ok:
            return ok, why
        last_ok = getattr(self.gateway, "last_ok", None)
        if last_ok is None:
            return False, "Redis has not answered yet"
        silent_s = time.monotonic() - last_ok
        if silent_s >= READY_WITHIN_S:
            return False, f"Redis has not answered for {silent_s:.1f}s"
        if self._group_missing:
            return False, "the assignment stream's consumer group does not exist"
        return True, "ready"

    def statistics(self) -> ConsumerStatistics:
        t = self.tally
        last_ok = getattr(self.gateway, "last_ok", None)
        return ConsumerStatistics(
            service=self.service,
            consumer=self.name,
            running=self.running and self._ready.is_set(),
            healthy=self.health()[0],
            ready=self.readiness()[0],
            owned_streams=len(self.owned_streams()),
            in_flight_handlers=sum(1 for o in self._streams if o.handling),
            last_redis_ok_at=None if last_ok is None else _wall(last_ok),
            last_scan_at=t.last_scan_at,
            entries=dict(t.entries),
            stream_events=dict(t.stream_events),
            recoveries=dict(t.recoveries),
            dead_letters=dict(t.dead_letters),
            handler_failures=t.handler_failures,
            heartbeats_failed=t.heartbeats_failed,
            loop_errors=dict(t.loop_errors),
            notifications=dict(t.notifications),
            scan_passes=t.scan_passes,
        )

    def finish(self, stream: str) -> None:
        owned = self.owned.get(stream)
        if owned is not None:
            owned.request_finish()

    async def claim(self, assignment_id: str) -> RequeueOutcome:
        return await self.recoverer.recover(assignment_id)

    async def reset_topology(self) -> None:
        if self.cluster_mode is ClusterMode.OSS:
            if not self.running:
                raise StreamJobsError("reset_topology() needs a running consumer")
            await self.loops.reset_topology()

    async def aclose(self) -> None:
        self._stop.set()
        if self.running:
            await self._stopped.wait()

    async def enter(self, run: Callable[..., Awaitable[None]]) -> None:
        """``async with consumer``: start ``run`` in a task group of our own."""
        self._cm_tg = anyio.create_task_group()
        await self._cm_tg.__aenter__()
        try:
            await self._cm_tg.start(_started_run, run)
        except BaseException as exc:
            await self._cm_tg.__aexit__(type(exc), exc, exc.__traceback__)
            raise

    async def exit(self) -> None:
        self._stop.set()
        assert self._cm_tg is not None
        tg, self._cm_tg = self._cm_tg, None
        await tg.__aexit__(None, None, None)

    async def run(self, task_status: anyio.abc.TaskStatus[None]) -> None:
        if self.running:
            raise StreamJobsError("this consumer is already running")
        self.running = True
        self._stopped = anyio.Event()
        self._intake_done = anyio.Event()
        self._draining = False
        # Each run() is a new incarnation (docs/design.md#sessions): a session of an
        # earlier run that was seen dead, or whose end failed, never comes back, and
        # locks that run left behind read as dead at once.
        self.session_confirmed_at = None
        self._new_incarnation()
        session = False
        try:
            if isinstance(self.gateway, Gateway):
                self.gateway.limiter = anyio.CapacityLimiter(self.config.redis_concurrency)
            await self._start_up()
            await self._touch_session()
            session = True
            async with anyio.create_task_group() as tg:
                await tg.start(self._host_streams)
                if self.waiter is not None:
                    await tg.start(self.waiter.run)
                tg.start_soon(self._heartbeat_loop)
                tg.start_soon(self._intake_loop)
                tg.start_soon(self._pulse_loop)
                if self._sampled and self.config.sample_interval_s is not None:
                    tg.start_soon(self._sample_loop, self.config.sample_interval_s)
                await self.loops.start(tg)
                self._ready.set()
                task_status.started()
                try:
                    await self._stop.wait()
                finally:
                    with anyio.CancelScope(shield=True):
                        await self._drain()
                tg.cancel_scope.cancel()
        finally:
            if session:
                await self._end_session()
            self.running = False
            # A stop ends this run only: the next run() starts with a fresh stop signal
            # and waits to be ready again. (Reset here, not at the start, so that an
            # aclose() that came before run() got going still stops it.)
            self._stop = anyio.Event()
            self._ready = anyio.Event()
            self._stopped.set()

    async def _check_eviction_policy(self) -> None:
        """Refuse to start (unless ``require_noeviction`` is off) when Redis may evict
        our keys. Read from ``INFO memory``, which managed services allow, on every
        primary of a cluster; a server that will not say is let through with a warning.
        """
        if self.client is None:
            return
        try:
            policies = await eviction_policies(self.client)
        except REDIS_FAILURES as exc:
            log.warning("cannot read maxmemory-policy (%s): make sure it is noeviction", exc)
            return
        bad = sorted({p for p in policies if p not in ("", "noeviction")})
        if not bad:
            return
        message = (
            f"is {' and '.join(repr(p) for p in bad)}: under memory pressure Redis may "
            "evict locks (streams are lost and dead-lettered) and the assignment stream "
            "itself (queued work vanishes); set it to 'noeviction' "
            "(docs/operations.md#memory-policy)"
        )
        if self.config.require_noeviction:
            raise ConfigurationError("maxmemory-policy", message)
        log.warning("maxmemory-policy %s (allowed: require_noeviction=False)", message)

    async def _start_up(self) -> None:
        """What must work before any loop runs: the group, the scripts, the memory
        policy. A missing permission is reported as such, naming what was refused."""
        try:
            await self.gateway.ensure_group()
            await self.gateway.load_scripts()
            await self._check_eviction_policy()
            try:
                await self.loops.probe()
            except PermissionDenied:
                raise
            except Exception as exc:  # unreachable or slow: the subscriber loop retries
                log.warning("keyspace subscription probe failed (%s)", exc)
        except PermissionDenied as exc:
            raise PermissionDenied(
                f"the consumer's Redis user lacks a permission it needs ({exc}); see "
                "docs/operations.md#least-privilege-acl"
            ) from exc

    # -- orchestration -----------------------------------------------------------------

    async def _host_streams(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        async with anyio.create_task_group() as streams:
            self._streams_tg = streams
            task_status.started()
            await anyio.sleep_forever()

    async def _drain(self) -> None:
        """Phases 2 and 3 of shutdown: stop intake, drain within the grace period, cancel."""
        self._draining = True
        self._wake_intake()
        # The intake read in flight is allowed to finish: an assignment the server
        # already delivered is handed back, never left pending without a lock. Only
        # then do streams stop: a stream handed back earlier could be re-read by that
        # very read, and bounce back once more.
        with anyio.move_on_after(self.config.read_block_ms / 1000 + CLEANUP_TIMEOUT_S):
            await self._intake_done.wait()
        # Streams not in a handler stop now and are handed back; one in a handler
        # stops when the call returns, or is cancelled after the grace period.
        for stream in list(self._streams):
            stream.interrupt()
        with anyio.move_on_after(self.config.shutdown_grace_s):
            await self._all_done.wait()
        for stream in list(self._streams):
            stream.cancel()
        with anyio.move_on_after(CLEANUP_TIMEOUT_S * 3):
            await self._all_done.wait()

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
        assert self._streams_tg is not None
        if self._all_done.is_set():
            self._all_done = anyio.Event()
        self._streams.add(stream)
        self._streams_tg.start_soon(self._stream_task, stream)

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

    async def _pulse_loop(self) -> None:
        """Proves the event loop turns (liveness) and that Redis answers (readiness):
        a PING when no other command got a reply for ``PULSE_S``."""
        guard = LoopGuard("pulse", self.service, self.metrics, log)
        while True:
            self._pulse_at = time.monotonic()
            last_ok = getattr(self.gateway, "last_ok", None)
            if last_ok is None or self._pulse_at - last_ok >= PULSE_S:
                try:
                    with anyio.fail_after(READY_WITHIN_S):
                        await self.gateway.ping()
                    guard.ok()
                except TimeoutError:
                    guard.record(RedisUnavailable("PING got no reply"), "ping")
                except Exception as exc:
                    guard.record(exc, "ping")
            await anyio.sleep(PULSE_S)

    async def _sample_loop(self, interval_s: float) -> None:
        """Samples the service's queue for the recorder's gauges."""
        guard = LoopGuard("sample", self.service, self.metrics, log)
        while True:
            try:
                sample = await self.gateway.sample()
                self.metrics.service_sampled(self.service, sample)
            except Exception as exc:  # Redis, or the user's recorder
                await guard.failed(exc, "sampling the queue")
                continue
            guard.ok()
            await anyio.sleep(interval_s)

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
            if not o.lost and o.acquired and now - o.lock_extended_at >= ttl_ms / 3000
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


def _wall(monotonic_at: float) -> float:
    """A ``time.monotonic()`` instant as wall-clock seconds since the epoch."""
    return time.time() - (time.monotonic() - monotonic_at)


async def _started_run(
    run: Callable[..., Awaitable[None]], *, task_status: anyio.abc.TaskStatus[None]
) -> None:
    await run(task_status=task_status)
