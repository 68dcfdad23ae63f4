"""StreamConsumer: subclass it, implement ``handle()``, run it.

One consumer owns up to ``max_concurrent_streams`` data streams at a time. Its
background work runs in one anyio task group:

* intake: XREADGROUP on the assignment stream for as many assignments as it has
  free slots (short BLOCK, so stopping is prompt), then one task per stream;
* a stream task: acquire the lock, then loop { fenced ack+read of a batch; hand each
  entry to ``handle()`` in order } until the end-of-stream marker, then finish;
* heartbeat: extend every owned lock (compare-and-set on the token) and record the
  new deadlines in the lease index;
* recovery (``_recovery_loops``): keyspace expiry events, the lease sweep and the
  XPENDING reconciliation scan.

Shutdown is two-phase (SPEC §3): stop intake, let in-flight handlers finish within
``shutdown_grace_s``, then cancel them; every unfinished stream is handed back
(re-queued without counting a retry, then unlocked) in a shielded, bounded step.
"""

from __future__ import annotations

import abc
import contextlib
import logging
import math
import os
import secrets
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, final

import anyio
import anyio.abc

from ._assignment import Assignment, parse_assignment, parse_retry_count
from ._backoff import Backoff
from ._keys import Keys
from ._recovery import Recoverer, dlq_meta
from ._recovery_loops import RecoveryLoops
from ._redis import REDIS_FAILURES, Gateway, RawFields
from .config import ClusterMode, ConsumerConfig, RecoveryConfig
from .exceptions import (
    ConfigurationError,
    DeadLetter,
    InvalidAssignment,
    Retry,
    StreamJobsError,
)
from .message import Message
from .metrics import DeadLetterReason, MetricsRecorder, NullRecorder, RequeueOutcome, StreamEvent

log = logging.getLogger("streamjobs")

_EOS_FIELD = "_eos"
# Bound on each shielded clean-up step (hand-back, final ack) during shutdown.
_CLEANUP_TIMEOUT_S = 5.0


def _default_consumer_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


@dataclass(eq=False)
class _Owned:
    """State of one stream this consumer holds the lock of."""

    assignment: Assignment
    token: str
    member: str
    lease_deadline: float
    lost: bool = False
    finish_requested: bool = False
    to_ack: list[str] = field(default_factory=list)
    changed: anyio.Event = field(default_factory=anyio.Event)
    wait_scope: anyio.CancelScope | None = None
    scope: anyio.CancelScope | None = None

    @property
    def stream(self) -> str:
        return self.assignment.stream

    def notify(self) -> None:
        """Wake every waiter on this stream's state (lease, lost, drain)."""
        self.changed.set()
        self.changed = anyio.Event()


class _Result:
    FINISHED = "finished"
    LOST = "lost"
    STOPPED = "stopped"


class StreamConsumer(abc.ABC):
    """Base class of a consumer: implement :meth:`handle`.

    Args:
        redis: a ``redis.asyncio.Redis`` (or ``RedisCluster`` with ``ClusterMode.OSS``).
            The consumer does not close it.
        service: the service name; consumers of one service share the work.
        config: ownership and processing settings.
        recovery: crash-recovery settings.
        cluster_mode: how the Redis deployment is laid out.
        metrics: where events are reported; defaults to :class:`NullRecorder`.
        consumer_name: this consumer's name in the consumer groups; default
            ``host-pid-random`` (unique per process start).

    Raises:
        ConfigurationError: a setting is invalid (names the field).
    """

    def __init__(
        self,
        redis: Any,
        *,
        service: str,
        config: ConsumerConfig | None = None,
        recovery: RecoveryConfig | None = None,
        cluster_mode: ClusterMode = ClusterMode.NONE,
        metrics: MetricsRecorder | None = None,
        consumer_name: str | None = None,
    ) -> None:
        self._config = config or ConsumerConfig()
        self._recovery = recovery or RecoveryConfig(
            min_idle_s=max(15.0, self._config.lock_ttl_s * 1.5)
        )
        self._recovery.check_against(self._config)
        if not isinstance(cluster_mode, ClusterMode):
            raise ConfigurationError("cluster_mode", "must be a ClusterMode")
        is_cluster_client = hasattr(redis, "get_primaries")
        if cluster_mode is ClusterMode.OSS and not is_cluster_client:
            raise ConfigurationError(
                "cluster_mode", "ClusterMode.OSS needs a redis.asyncio.RedisCluster client"
            )
        if cluster_mode is ClusterMode.NONE and is_cluster_client:
            raise ConfigurationError(
                "cluster_mode", "a RedisCluster client needs ClusterMode.OSS (or PROXY)"
            )
        self._keys = Keys(service, self._config.key_prefix)
        self._name = consumer_name or _default_consumer_name()
        if not self._name or any(c.isspace() for c in self._name):
            raise ConfigurationError("consumer_name", "must be non-empty, without whitespace")
        self._redis = redis
        self._cluster_mode = cluster_mode
        self._metrics: MetricsRecorder = metrics or NullRecorder()
        self._gw = Gateway(
            redis,
            self._keys,
            dlq=self._recovery.dlq_stream or self._keys.dead_letters,
            dlq_maxlen=self._recovery.dlq_maxlen,
        )
        self._recoverer = Recoverer(
            self._gw,
            max_retries=self._recovery.max_retries,
            metrics=self._metrics,
            service=service,
        )
        self._loops = RecoveryLoops(
            redis,
            self._gw,
            self._recoverer,
            recovery=self._recovery,
            consumer=self._config,
            cluster_mode=cluster_mode,
            metrics=self._metrics,
        )
        self._owned: dict[str, _Owned] = {}
        self._active = 0  # assignments in hand: acquiring, owned, or handing back
        self._slot_freed = anyio.Event()
        self._all_done = anyio.Event()
        self._all_done.set()
        self._stop = anyio.Event()
        self._stopped = anyio.Event()
        self._ready = anyio.Event()
        self._draining = False
        self._running = False
        self._streams_tg: anyio.abc.TaskGroup | None = None
        self._cm_tg: anyio.abc.TaskGroup | None = None

    # -- the subclass contract -------------------------------------------------------

    @abc.abstractmethod
    async def handle(self, message: Message) -> None:
        """Process one entry. Called in order within a stream, concurrently across streams.

        Return to have the entry acknowledged. Raise :class:`Retry` to retry after a
        delay, :class:`DeadLetter` to dead-letter it now, or any other exception to
        retry with backoff up to ``max_handler_attempts`` (then it is dead-lettered
        with reason ``handler_failed`` and the next entry follows).
        """

    async def on_stream_start(self, stream: str, info: Mapping[str, Any]) -> None:  # noqa: B027
        """Called once the stream's lock is held, before its first entry is handled."""

    async def on_stream_end(self, stream: str) -> None:  # noqa: B027
        """Called after the stream finished (end marker handled, assignment completed)."""

    async def on_stream_lost(self, stream: str) -> None:  # noqa: B027
        """Called when the lock was lost (expired or taken over): no more of its entries
        reach ``handle()`` here, and nothing more of it is acknowledged by this consumer."""

    # -- public framework API ---------------------------------------------------------

    @final
    @property
    def service(self) -> str:
        return self._keys.service

    @final
    @property
    def consumer_name(self) -> str:
        return self._name

    @final
    @property
    def owned_streams(self) -> frozenset[str]:
        """Names of the streams this consumer currently holds the lock of."""
        return frozenset(s for s, o in self._owned.items() if not o.lost)

    @final
    async def wait_ready(self) -> None:
        """Wait until :meth:`run` has started all its loops."""
        await self._ready.wait()

    @final
    def finish(self, stream: str) -> None:
        """Finish ``stream`` after the current entry, as if its end marker had been read."""
        owned = self._owned.get(stream)
        if owned is not None:
            owned.finish_requested = True

    @final
    async def claim(self, assignment_id: str) -> RequeueOutcome:
        """Recover one pending assignment now (the primitive the scanner uses).

        The lock of its stream must be gone (``OWNER_ALIVE`` otherwise). The result is
        that the assignment is re-queued for whichever consumer reads it next, or
        dead-lettered; this consumer does not take it directly.
        """
        return await self._recoverer.recover(assignment_id)

    @final
    async def reset_topology(self) -> None:
        """Re-discover the cluster's primaries and rebuild keyspace subscriptions.

        ``ClusterMode.OSS`` only (a no-op otherwise): checks the cluster is settled
        (every reachable node ``cluster_state:ok`` and agreeing on slot owners),
        refreshes the client's slot map, re-applies keyspace configuration on the
        current primaries and rebuilds subscriptions, exactly one per primary. The
        consumer also does this by itself when a subscription dies or the primary set
        changes; this hook is for operators.

        Raises:
            ClusterNotSettled: the cluster is mid-failover or resharding; nothing changed.
        """
        if self._cluster_mode is ClusterMode.OSS:
            if not self._running:
                raise StreamJobsError("reset_topology() needs a running consumer")
            await self._loops.reset_topology()

    @final
    async def aclose(self) -> None:
        """Stop gracefully (see the module docstring) and wait until :meth:`run` returned."""
        self._stop.set()
        if self._running:
            await self._stopped.wait()

    @final
    async def __aenter__(self) -> StreamConsumer:
        self._cm_tg = anyio.create_task_group()
        await self._cm_tg.__aenter__()
        await self._cm_tg.start(self._run_in_cm)
        return self

    async def _run_in_cm(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        await self.run(task_status=task_status)

    @final
    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._cm_tg is not None
        await self._cm_tg.__aexit__(None, None, None)

    @final
    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Consume until :meth:`aclose` is called or this task is cancelled.

        Raises:
            RedisUnavailable: Redis could not be reached at start-up.
        """
        if self._running:
            raise StreamJobsError("this consumer is already running")
        self._running = True
        self._stopped = anyio.Event()
        try:
            await self._gw.ensure_group()
            async with anyio.create_task_group() as tg:
                await tg.start(self._host_streams)
                tg.start_soon(self._heartbeat_loop)
                intake_scope = anyio.CancelScope()
                tg.start_soon(self._intake_loop, intake_scope)
                await self._loops.start(tg)
                self._ready.set()
                task_status.started()
                try:
                    await self._stop.wait()
                finally:
                    with anyio.CancelScope(shield=True):
                        intake_scope.cancel()
                        await self._drain()
                tg.cancel_scope.cancel()
        finally:
            self._running = False
            self._stopped.set()

    # -- orchestration -----------------------------------------------------------------

    async def _host_streams(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        async with anyio.create_task_group() as streams:
            self._streams_tg = streams
            task_status.started()
            await anyio.sleep_forever()

    async def _drain(self) -> None:
        """Phase 2 and 3 of shutdown: drain within the grace period, then cancel."""
        self._draining = True
        for owned in list(self._owned.values()):
            if owned.wait_scope is not None:
                owned.wait_scope.cancel()
            owned.notify()
        with anyio.move_on_after(self._config.shutdown_grace_s):
            await self._all_done.wait()
        for owned in list(self._owned.values()):
            if owned.scope is not None:
                owned.scope.cancel()
        with anyio.move_on_after(_CLEANUP_TIMEOUT_S * 3):
            await self._all_done.wait()

    def _take_slot(self) -> None:
        self._active += 1
        self._all_done = anyio.Event() if self._all_done.is_set() else self._all_done

    def _free_slot(self) -> None:
        self._active -= 1
        self._slot_freed.set()
        self._slot_freed = anyio.Event()
        if self._active == 0:
            self._all_done.set()

    async def _intake_loop(self, scope: anyio.CancelScope) -> None:
        backoff = Backoff()
        with scope:
            while True:
                free = self._config.max_concurrent_streams - self._active
                if free <= 0:
                    await self._slot_freed.wait()
                    continue
                try:
                    batch = await self._gw.read_assignments(
                        self._name, free, self._config.read_block_ms
                    )
                except REDIS_FAILURES as exc:
                    self._metrics.loop_error(self.service, "intake")
                    delay = backoff.next_delay()
                    log.warning("intake: %s; retrying in %.2fs", exc, delay)
                    if "NOGROUP" in str(exc):  # the LBS or its group was deleted
                        with contextlib.suppress(*REDIS_FAILURES):
                            await self._gw.ensure_group()
                    await anyio.sleep(delay)
                    continue
                backoff.reset()
                for entry_id, fields in batch:
                    try:
                        assignment = parse_assignment(entry_id, fields)
                    except InvalidAssignment as exc:
                        await self._dead_letter_unparseable(entry_id, fields, exc)
                        continue
                    assert self._streams_tg is not None
                    self._take_slot()
                    self._streams_tg.start_soon(self._stream_task, assignment)

    async def _dead_letter_unparseable(
        self, entry_id: str, fields: RawFields, exc: InvalidAssignment
    ) -> None:
        log.warning("assignment %s is unparseable (%s): dead-lettering it", entry_id, exc)
        try:
            retry = parse_retry_count(fields)
        except InvalidAssignment:
            retry = 0
        try:
            moved = await self._gw.dead_letter_assignment(
                entry_id,
                "",
                dlq_meta(
                    DeadLetterReason.UNPARSEABLE,
                    retry_count=retry,
                    source_stream=self._keys.assignments,
                    source_id=entry_id,
                    owner=self._name,
                    error=str(exc),
                ),
            )
        except REDIS_FAILURES:
            # Still pending with no lock: the reconciliation scan dead-letters it later.
            self._metrics.loop_error(self.service, "intake")
            return
        if moved is not None:
            self._metrics.dead_lettered(self.service, DeadLetterReason.UNPARSEABLE)
            if moved[1] > 0:
                self._metrics.dlq_trimmed(self.service, moved[1])

    # -- one stream ------------------------------------------------------------------

    async def _stream_task(self, assignment: Assignment) -> None:
        try:
            owned = await self._acquire(assignment)
            if owned is None:
                return
            result = _Result.STOPPED
            try:
                with anyio.CancelScope() as owned.scope:
                    result = await self._process(owned)
            finally:
                with anyio.CancelScope(shield=True):
                    await self._settle(owned, result)
        finally:
            self._free_slot()

    async def _acquire(self, assignment: Assignment) -> _Owned | None:
        """Take the stream's lock; hand the assignment back if someone holds it."""
        token = f"{self._name}:{secrets.token_hex(8)}"
        member = assignment.id
        ttl_ms = self._config.lock_ttl_ms
        backoff = Backoff(base_s=0.05, cap_s=self._config.heartbeat_s)
        give_up_at = time.monotonic() + self._config.heartbeat_s
        while not self._draining:
            started = time.monotonic()
            try:
                if await self._gw.acquire(assignment.stream, token, ttl_ms):
                    owned = _Owned(
                        assignment,
                        token,
                        member,
                        lease_deadline=started + self._config.lock_ttl_s - self._config.margin_s,
                    )
                    self._owned[assignment.stream] = owned
                    self._metrics.stream_event(self.service, StreamEvent.ACQUIRED)
                    self._metrics.owned_streams(self.service, len(self._owned))
                    # Without a lease record (Redis failed here) a crash is still found,
                    # by the XPENDING scan after min_idle_s instead of the lease sweep.
                    with contextlib.suppress(*REDIS_FAILURES):
                        await self._gw.record_leases([member], ttl_ms, new=True)
                    return owned
            except REDIS_FAILURES:
                self._metrics.loop_error(self.service, "acquire")
            if time.monotonic() >= give_up_at:
                break
            # Usually a graceful hand-back whose unlock is a moment behind its re-queue.
            await anyio.sleep(backoff.next_delay())
        self._metrics.stream_event(self.service, StreamEvent.CONTENDED)
        # On failure it stays pending without our lock: recovery re-queues it.
        with (
            anyio.CancelScope(shield=True),
            anyio.move_on_after(_CLEANUP_TIMEOUT_S),
            contextlib.suppress(*REDIS_FAILURES),
        ):
            await self._gw.requeue(assignment.id, "", None)
        return None

    async def _process(self, owned: _Owned) -> str:
        """Hand the stream's entries to ``handle()`` until it ends, is lost or we stop."""
        stream = owned.stream
        try:
            await self.on_stream_start(stream, owned.assignment.info)
        except Exception:
            log.exception("on_stream_start(%r) raised; continuing", stream)
        backoff = Backoff()
        batch_size = self._config.read_batch_size
        while True:
            if owned.lost:
                return _Result.LOST
            if self._draining:
                return _Result.STOPPED
            try:
                ok, top, batch = await self._gw.fenced_read(
                    stream, owned.token, self._name, batch_size, owned.to_ack
                )
            except REDIS_FAILURES as exc:
                self._metrics.loop_error(self.service, "stream")
                delay = backoff.next_delay()
                log.warning(
                    "stream %r: Redis unavailable (%s); retrying in %.2fs", stream, exc, delay
                )
                await self._pause(owned, delay)
                continue
            backoff.reset()
            if not ok:
                self._mark_lost(owned)
                return _Result.LOST
            owned.to_ack = []
            if not batch:
                await self._wait_for_entries(owned, top)
                continue
            handled = 0
            started = time.perf_counter()
            info = owned.assignment.info
            handle = self.handle
            monotonic = time.monotonic
            for entry_id, fields in batch:
                if fields.get(_EOS_FIELD) == "1" or owned.finish_requested:
                    self._count_handled(handled, started)
                    eos = [entry_id] if fields.get(_EOS_FIELD) == "1" else []
                    return await self._finish(owned, eos)
                # Hot path: one clock read and no extra await per entry while the
                # local lease is valid; the slow path waits for a heartbeat.
                if (
                    owned.lost or self._draining or monotonic() >= owned.lease_deadline
                ) and not await self._lease_valid(owned):
                    break
                try:
                    await handle(Message(stream, entry_id, fields, info, 1))
                except Exception as exc:
                    if not await self._retry_entry(owned, entry_id, fields, exc):
                        break
                handled += 1
                owned.to_ack.append(entry_id)
            self._count_handled(handled, started)
            if owned.finish_requested:
                return await self._finish(owned, [])

    def _count_handled(self, handled: int, started: float) -> None:
        if handled:
            self._metrics.entries_handled(self.service, handled, time.perf_counter() - started)

    async def _wait_for_entries(self, owned: _Owned, top: str) -> None:
        with anyio.CancelScope() as owned.wait_scope:
            if owned.lost or self._draining:
                return
            try:
                await self._gw.wait_for_entries(owned.stream, top, self._config.read_block_ms)
            except REDIS_FAILURES:
                self._metrics.loop_error(self.service, "stream")
                await anyio.sleep(Backoff().next_delay())
        owned.wait_scope = None

    async def _pause(self, owned: _Owned, delay_s: float) -> bool:
        """Sleep ``delay_s`` unless the stream is lost or shutdown starts; True if it slept."""
        deadline = time.monotonic() + delay_s
        while True:
            changed = owned.changed
            if owned.lost or self._draining:
                return False
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return True
            with anyio.move_on_after(remaining):
                await changed.wait()

    async def _lease_valid(self, owned: _Owned) -> bool:
        """True if the local lease allows handing the next entry to ``handle()``.

        Past the lease deadline (a pause, or heartbeats failing) wait for the heartbeat
        to extend the lock or to find it lost; never hand an entry on an expired lease.
        """
        while True:
            changed = owned.changed
            if owned.lost or self._draining:
                return False
            if time.monotonic() < owned.lease_deadline:
                return True
            await changed.wait()

    async def _retry_entry(
        self, owned: _Owned, entry_id: str, fields: dict[str, str], first: Exception
    ) -> bool:
        """Attempts 2.. of an entry whose first ``handle()`` call raised ``first``.

        Returns:
            True if the entry is done (handled or dead-lettered), False if the stream
            was lost or shutdown began while retrying (the entry stays unacked).
        """
        attempt = 1
        cfg = self._config
        error: Exception = first
        message = Message(owned.stream, entry_id, fields, owned.assignment.info, attempt)
        while True:
            self._metrics.handler_failed(self.service)
            if isinstance(error, DeadLetter):
                return await self._dead_letter_entry(owned, message, f"DeadLetter: {error.reason}")
            if isinstance(error, Retry):
                delay = error.delay_s
            else:
                delay = min(cfg.handler_backoff_max_s, cfg.handler_backoff_s * 2 ** (attempt - 1))
            if attempt >= cfg.max_handler_attempts:
                log.warning(
                    "stream %r entry %s failed %d times (%s): dead-lettering it",
                    owned.stream,
                    entry_id,
                    attempt,
                    error,
                )
                return await self._dead_letter_entry(
                    owned, message, f"{type(error).__name__}: {error}"
                )
            attempt += 1
            if not await self._pause(owned, delay) or not await self._lease_valid(owned):
                return False
            message = Message(owned.stream, entry_id, fields, owned.assignment.info, attempt)
            try:
                await self.handle(message)
                return True
            except Exception as exc:
                error = exc

    async def _dead_letter_entry(self, owned: _Owned, message: Message, error: str) -> bool:
        """Append a dead letter for a data entry; True once it is written."""
        meta = dlq_meta(
            DeadLetterReason.HANDLER_FAILED,
            retry_count=owned.assignment.retry_count,
            source_stream=owned.stream,
            source_id=message.id,
            owner=self._name,
            error=error,
        )
        names = {k for k, _ in meta}
        fields = [(k, v) for k, v in message.fields.items() if k not in names]
        fields.append(("_attempts", str(message.attempt)))
        backoff = Backoff()
        while True:
            try:
                _, trimmed = await self._gw.dead_letter_entry(fields + meta)
            except REDIS_FAILURES:
                self._metrics.loop_error(self.service, "stream")
                if not await self._pause(owned, backoff.next_delay()):
                    return False
                continue
            self._metrics.dead_lettered(self.service, DeadLetterReason.HANDLER_FAILED)
            if trimmed > 0:
                self._metrics.dlq_trimmed(self.service, trimmed)
            return True

    async def _finish(self, owned: _Owned, eos: list[str]) -> str:
        """Complete the assignment, THEN release the lock (never the other way round)."""
        cfg = self._config
        keep_ms = (
            -1 if cfg.finished_stream_ttl_s is None else math.ceil(cfg.finished_stream_ttl_s * 1000)
        )
        backoff = Backoff()
        while True:
            try:
                completed = await self._gw.finish(owned.assignment.id, owned.member)
                # Released even when ``completed`` is False: that is either a client retry
                # of our own finish (the lock is still ours) or a recoverer that re-queued
                # it after our lock expired (then the token check refuses everything).
                released = await self._gw.release(
                    owned.stream, owned.token, keep_ms, [*owned.to_ack, *eos]
                )
                break
            except REDIS_FAILURES:
                self._metrics.loop_error(self.service, "stream")
                if not await self._pause(owned, backoff.next_delay()):
                    return _Result.STOPPED if not owned.lost else _Result.LOST
        owned.to_ack = []
        if not (completed or released):
            self._mark_lost(owned)
            return _Result.LOST
        self._metrics.stream_event(self.service, StreamEvent.FINISHED)
        del self._owned[owned.stream]
        self._metrics.owned_streams(self.service, len(self._owned))
        try:
            await self.on_stream_end(owned.stream)
        except Exception:
            log.exception("on_stream_end(%r) raised", owned.stream)
        return _Result.FINISHED

    def _mark_lost(self, owned: _Owned) -> None:
        """The lock is gone or someone else's: stop at once, ack nothing, tell the user."""
        if owned.lost:
            return
        owned.lost = True
        owned.to_ack = []  # a disowned consumer acks nothing
        if owned.wait_scope is not None:
            owned.wait_scope.cancel()
        owned.notify()
        self._metrics.stream_event(self.service, StreamEvent.LOST)
        log.warning("lost stream %r (lock expired or taken over)", owned.stream)
        # Reported now, not when the in-flight handler returns (it may run for long).
        assert self._streams_tg is not None
        self._streams_tg.start_soon(self._report_lost, owned.stream)

    async def _report_lost(self, stream: str) -> None:
        with anyio.move_on_after(_CLEANUP_TIMEOUT_S):
            try:
                await self.on_stream_lost(stream)
            except Exception:
                log.exception("on_stream_lost(%r) raised", stream)

    async def _settle(self, owned: _Owned, result: str) -> None:
        """Shielded clean-up after a stream task ends: hand an unfinished stream back."""
        if result == _Result.FINISHED:
            return
        self._owned.pop(owned.stream, None)
        self._metrics.owned_streams(self.service, len(self._owned))
        if result == _Result.STOPPED and not owned.lost:
            with anyio.move_on_after(_CLEANUP_TIMEOUT_S):
                await self._hand_back(owned)

    async def _hand_back(self, owned: _Owned) -> None:
        """Give an unfinished stream back at once (SPEC §3 graceful shutdown).

        1. Ack what was handled (fenced): handled work is finished work.
        2. Re-queue the assignment without counting a retry, XACK-first and atomic.
        3. Release the lock. Re-queue comes first so that "pending without a lock",
           which recoverers treat as a dead owner, never happens; a consumer that reads
           the re-queued assignment in between retries the lock for a moment.
        """
        try:
            ok, _, _ = await self._gw.fenced_read(
                owned.stream, owned.token, self._name, 0, owned.to_ack
            )
            owned.to_ack = []
            if not ok:
                self._mark_lost(owned)
                return
            await self._gw.requeue(owned.assignment.id, owned.member, None)
            await self._gw.release(owned.stream, owned.token, -1)
        except REDIS_FAILURES as exc:
            log.warning(
                "could not hand back stream %r (%s): its lock will expire and it will be recovered",
                owned.stream,
                exc,
            )
            return
        self._metrics.stream_event(self.service, StreamEvent.HANDED_BACK)

    # -- heartbeat ---------------------------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        cfg = self._config
        retry_s = min(cfg.heartbeat_s, 0.5)
        delay = cfg.heartbeat_s
        while True:
            await anyio.sleep(delay)
            live = [o for o in self._owned.values() if not o.lost]
            if not live:
                delay = cfg.heartbeat_s
                continue
            sent = time.monotonic()
            try:
                results = await self._gw.extend_many(
                    [(o.stream, o.token) for o in live], cfg.lock_ttl_ms
                )
            except REDIS_FAILURES as exc:
                # Tolerated up to the TTL: the local lease stops handing entries once it
                # lapses, and an extend that succeeds later proves nobody took over.
                self._metrics.heartbeat(self.service, False)
                log.warning("heartbeat: Redis unavailable (%s)", exc)
                delay = retry_s
                for o in live:
                    o.notify()
                continue
            self._metrics.heartbeat(self.service, True)
            delay = cfg.heartbeat_s
            members = []
            for o, extended in zip(live, results, strict=True):
                if extended:
                    o.lease_deadline = sent + cfg.lock_ttl_s - cfg.margin_s
                    members.append(o.member)
                    o.notify()
                else:
                    self._mark_lost(o)
            try:
                await self._gw.record_leases(members, cfg.lock_ttl_ms, new=False)
            except REDIS_FAILURES:
                self._metrics.loop_error(self.service, "heartbeat")
