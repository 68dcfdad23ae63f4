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

import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import anyio
import anyio.abc

from ._backoff import Backoff
from ._cluster_waiter import ClusterWaiter, idle_wait
from ._coalesce import Coalescer
from ._guard import LoopGuard, log_failure
from ._intake import Intake
from ._kind_runtime import KindRuntime, Parts
from ._pipeline import Hooks
from ._recovery import Recoverer
from ._recovery_loops import RecoveryLoops
from ._redis._admin import eviction_policies
from ._redis._boundary import REDIS_FAILURES
from ._redis._channel import Channel
from ._redis._gateway import Gateway
from ._redis._protocol import StreamGateway
from ._runtime_liveness import Heartbeat, log
from ._stream_state import CLEANUP_TIMEOUT_S, OwnedStreamState
from ._waiter import Waiter
from .config import ClusterMode
from .exceptions import (
    ConfigurationError,
    PermissionDenied,
    RedisUnavailable,
    StreamJobsError,
)
from .metrics import NullRecorder, RequeueOutcome

PULSE_S = 1.0
"""How often the pulse loop turns, and how long Redis may be silent before a PING."""
READY_WITHIN_S = 5.0
"""Ready only if a command got a reply this recently."""
HEALTHY_WITHIN_S = 10.0
"""Healthy only if the pulse loop turned this recently (the event loop is not stuck)."""
START_UP_RETRY_S = 15.0
"""How long start-up is tried again while Redis is unavailable before ``run()`` raises."""


class Runtime(KindRuntime):
    """One running consumer: its state, what its streams call on it (the ``Host`` of
    ``_stream_state``), its public operations, start-up, the task group and the
    two-phase shutdown. Its intake and liveness are collaborators it holds
    (``_intake.Intake``, ``_runtime_liveness.Heartbeat``). Constructing it does no I/O.

    Args:
        parts: the hooks (a ``StreamConsumer``: ``Hooks``), the gateway, the client
            (for keyspace subscriptions; unused in PROXY mode), the name, the settings
            and the recorder.
        cluster_mode: how the Redis deployment is laid out.
    """

    def __init__(self, parts: Parts, *, cluster_mode: ClusterMode) -> None:
        super().__init__(parts)
        self.hooks: Hooks = parts.hooks
        gateway: StreamGateway = parts.gateway
        self.gateway: StreamGateway = gateway
        client, name, config, recovery = parts.client, parts.name, parts.config, parts.recovery
        metrics = parts.metrics
        # Sampling the queue is for a recorder's gauges: not done for the default one.
        self._sampled = type(metrics) is not NullRecorder
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
        self.owned: dict[str, OwnedStreamState] = {}
        self.entry_size_hint = config.read_batch_bytes  # unknown: read one entry first
        shared = (cluster_mode is ClusterMode.NONE and client is not None) or (
            cluster_mode is ClusterMode.OSS and isinstance(gateway, Gateway)
        )
        self.waiter: Waiter | ClusterWaiter | None = (
            idle_wait(
                client,
                gateway,
                cluster=cluster_mode is ClusterMode.OSS,
                block_ms=config.read_block_ms,
                streams=config.max_concurrent_streams,
                metrics=self.metrics,
                service=self.service,
                configure_flags=recovery.configure_keyspace_events,
            )
            if shared
            else None
        )
        self._draining = False
        self.heartbeat = Heartbeat(self)
        self.intake = Intake(self, self.heartbeat)
        self._pulse_at = 0.0  # monotonic time of the pulse loop's last turn
        self._leases: Coalescer[str, bool] = Coalescer(self._take_leases)

    # -- what OwnedStream needs (the Host protocol) --------------------------------------

    @property
    def draining(self) -> bool:
        return self._draining

    @property
    def session_confirmed_at(self) -> float | None:
        return self.heartbeat.confirmed_at

    @property
    def lock_ttl_ms(self) -> int:
        cfg = self.config
        return cfg.session_lock_ttl_ms if self.heartbeat.session_mode else cfg.lock_ttl_ms

    async def take_lease(self, assignment_id: str) -> bool:
        return await self._leases(assignment_id)

    async def _take_leases(self, ids: Sequence[str]) -> list[bool]:
        return await self.gateway.streams.take_leases(ids, self.name, self.lock_ttl_ms)

    def lock_token(self) -> str:
        return self.heartbeat.lock_token()

    def adopt(self, stream: OwnedStreamState) -> None:
        previous = self.owned.get(stream.stream)
        if previous is not None and previous is not stream:
            # This consumer took the stream again (it stalled past its TTL and then
            # read its own re-queued assignment): the new lock proves the old one gone.
            previous.mark_lost()
        self.owned[stream.stream] = stream
        self.metrics.owned_streams(self.service, len(self.owned))

    def disown(self, stream: OwnedStreamState) -> None:
        if self.owned.get(stream.stream) is stream:
            del self.owned[stream.stream]
            self.metrics.owned_streams(self.service, len(self.owned))

    def spawn(self, fn: Callable[[], Coroutine[Any, Any, None]]) -> None:
        self.intake.spawn(fn)

    # -- public operations (StreamConsumer delegates here) -------------------------------

    def owned_streams(self) -> frozenset[str]:
        return frozenset(s for s, o in self.owned.items() if not o.lost)

    async def wait_ready(self) -> None:
        await self.life.wait_ready()

    def health(self) -> tuple[bool, str]:
        """Liveness: running, with an event loop that turned within
        ``HEALTHY_WITHIN_S``. Safe to call from another thread (reads numbers only)."""
        if not self.life.started:
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
        if self.intake.group_missing:
            return False, "the assignment stream's consumer group does not exist"
        return True, "ready"

    def held(self) -> tuple[int, int]:
        return len(self.owned_streams()), sum(1 for o in self.intake.streams if o.handling)

    def finish(self, stream: str) -> None:
        owned = self.owned.get(stream)
        if owned is not None:
            owned.request_finish()

    async def claim(self, assignment_id: str) -> RequeueOutcome:
        return await self.recoverer.recover(assignment_id)

    async def reset_topology(self) -> None:
        if self.cluster_mode is ClusterMode.OSS:
            if not self.life.active:
                raise StreamJobsError("reset_topology() needs a running consumer")
            await self.loops.reset_topology()

    async def aclose(self) -> None:
        await self.life.aclose()

    async def run(self, task_status: anyio.abc.TaskStatus[None]) -> None:
        async with self.life.running():
            self.intake.reset()
            self._draining = False
            # Each run() is a new incarnation (docs/design.md#sessions): a session of an
            # earlier run that was seen dead, or whose end failed, never comes back, and
            # locks that run left behind read as dead at once.
            self.heartbeat.confirmed_at = None
            self.heartbeat.new_incarnation()
            session = False
            try:
                if isinstance(self.gateway, Gateway):
                    self.gateway.limiter = anyio.CapacityLimiter(self.config.redis_concurrency)
                    self.gateway.scripts.channel = Channel(self.gateway.client)
                await self._start_up_through_blips()
                await self.life.hook("on_startup")
                await self.heartbeat.touch_session()
                session = True
                await self.heartbeat.forget_stop()
                async with anyio.create_task_group() as tg:
                    await tg.start(self.intake.host_streams)
                    if self.waiter is not None:
                        await tg.start(self.waiter.run)
                    tg.start_soon(self.heartbeat.heartbeat_loop)
                    tg.start_soon(self.intake.loop)
                    tg.start_soon(self._pulse_loop)
                    if self._sampled and self.config.sample_interval_s is not None:
                        tg.start_soon(self._sample_loop, self.config.sample_interval_s)
                    await self.loops.start(tg)
                    self.life.ready.set()
                    task_status.started()
                    try:
                        await self.life.stop.wait()
                    finally:
                        with anyio.CancelScope(shield=True):
                            await self._drain()
                    tg.cancel_scope.cancel()
            finally:
                if session:
                    await self.heartbeat.end_session()

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

    async def _start_up_through_blips(self) -> None:
        """:meth:`_start_up`, tried again while Redis is briefly away (a dropped
        connection, a server restarting or loading its data) for up to
        :data:`START_UP_RETRY_S`: a blip as a worker starts must not end it. Anything
        else, or a Redis still away after that, is raised."""
        deadline = time.monotonic() + START_UP_RETRY_S
        backoff = Backoff(base_s=0.1, cap_s=2.0)
        while True:
            try:
                await self._start_up()
                return
            except RedisUnavailable as exc:
                delay = backoff.next_delay()
                if time.monotonic() + delay > deadline:
                    raise
                log_failure(log, "starting up", exc, delay)
                await anyio.sleep(delay)

    async def _start_up(self) -> None:
        """What must work before any loop runs: the group, the scripts, the memory
        policy. A missing permission is reported as such, naming what was refused."""
        try:
            await self.gateway.assignments.ensure_group()
            await self.gateway.assignments.load_scripts()
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

    async def _drain(self) -> None:
        """Phases 2 and 3 of shutdown: stop intake, drain within the grace period, cancel."""
        self._draining = True
        intake = self.intake
        intake.wake()
        # The intake read in flight is allowed to finish: an assignment the server
        # already delivered is handed back, never left pending without a lock. Only
        # then do streams stop: a stream handed back earlier could be re-read by that
        # very read, and bounce back once more.
        with anyio.move_on_after(self.config.read_block_ms / 1000 + CLEANUP_TIMEOUT_S):
            await intake.done.wait()
        # Streams not in a handler stop now and are handed back; one in a handler
        # stops when the call returns, or is cancelled after the grace period.
        for stream in list(intake.streams):
            stream.interrupt()
        with anyio.move_on_after(self.config.shutdown_grace_s):
            await intake.all_done.wait()
        for stream in list(intake.streams):
            stream.cancel()
        with anyio.move_on_after(CLEANUP_TIMEOUT_S * 3):
            await intake.all_done.wait()

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
                        await self.gateway.assignments.ping()
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
                sample = await self.gateway.assignments.sample()
                self.metrics.service_sampled(self.service, sample)
            except Exception as exc:  # Redis, or the user's recorder
                await guard.failed(exc, "sampling the queue")
                continue
            guard.ok()
            await anyio.sleep(interval_s)
