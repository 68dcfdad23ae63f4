"""The background loops that find dead owners (docs/design.md#recovery, docs/recovery.md).

* Lease sweep (every ``lease_check_interval_s``, and soon after any lock-expiry
  event): takes the assignments whose recorded lock deadline has passed from the
  lease index, each handed to exactly one consumer, and recovers them. Touching the
  lock (EXISTS) makes Redis expire it at once, so recovery latency stays near
  ``lock_ttl_s`` however far behind Redis's own expiry cycle is.
* Reconciliation scan (every ``interval_s`` plus jitter, first pass at start-up):
  one XPENDING page of entries idle for ``min_idle_s``, resuming from a cursor and
  wrapping around, so live long-running entries at the head cannot hide a dead one.
  Entries with a live lease are skipped without touching their locks.
* Keyspace subscriptions (``_notifications``; one for ``ClusterMode.NONE``, one per
  primary for ``ClusterMode.OSS``, none for ``PROXY``): expiry events of lock keys
  wake the sweep after a small random delay. Purely a latency optimisation.
"""

from __future__ import annotations

import logging
import random
import time
from typing import Any

import anyio
import anyio.abc

from ._backoff import Backoff
from ._guard import LoopGuard, log_failure
from ._notifications import (
    ClusterWatcher,
    describe,
    ensure_keyspace_events,
    probe_subscription,
    subscribe,
)
from ._recovery import Recoverer
from ._redis._admin import client_db
from ._redis._protocol import StreamGateway
from ._session import parse_member as parse_session_member
from .config import ClusterMode, ConsumerConfig, RecoveryConfig
from .metrics import MetricsRecorder

log = logging.getLogger(__name__)

_STABLE_SUBSCRIPTION_S = 10.0
"""A subscription that lasted this long had worked: its loss re-subscribes at once.
One refused or lost sooner backs off (capped, jittered), so a refusal (NOPERM) is not
retried many times a second."""

_SWEEP_LIMIT = 100
_RECOVERY_CONCURRENCY = 8
"""Recoveries one sweep runs at once. Each takes three round trips (read the entry,
check the lock, re-queue); one after the other, a consumer found dead with 100 streams
had its last one re-queued 1.9 s past its deadline (benchmarks/README.md)."""
_DUE_SLACK_S = (0.01, 0.05)
"""Sleep this much past the earliest deadline (uniform), so that the owner's lease is
surely past and a fleet's sweepers do not all wake at the same instant."""
_SESSION_MIN_IDLE_MS = 2000
"""A dead session's assignments pending for less are left to a later sweep: they were
read by a live incarnation under the same consumer name, which is taking their locks."""


class RecoveryLoops:
    """Runs the recovery loops of one consumer."""

    def __init__(
        self,
        client: Any,
        gateway: StreamGateway,
        recoverer: Recoverer,
        *,
        recovery: RecoveryConfig,
        consumer: ConsumerConfig,
        cluster_mode: ClusterMode,
        metrics: MetricsRecorder,
        name: str = "",
        rng: random.Random | None = None,
    ) -> None:
        self._client = client
        self._gw = gateway
        self._recoverer = recoverer
        self._cfg = recovery
        self._consumer = consumer
        self._mode = cluster_mode
        self._metrics = metrics
        self._name = name
        self._rng = rng or random.Random()
        self._service = gateway.keys.service
        self._wake = anyio.Event()
        self._cursor = "-"
        self.inspected = 0
        """Pending entries read by the current (or last) reconciliation pass."""
        self._watcher: ClusterWatcher | None = None
        if cluster_mode is ClusterMode.OSS:
            self._watcher = ClusterWatcher(
                client,
                self._channel_pattern(),
                ensure_flags=self.ensure_keyspace_events,
                on_expired=self.wake_sweep,
                metrics=metrics,
                service=self._service,
                check_interval_s=recovery.topology_check_interval_s,
            )

    async def probe(self) -> None:
        """Check at start-up that the keyspace subscription is allowed (standalone; on a
        cluster each primary's subscription reports its own refusal)."""
        if self._mode is ClusterMode.NONE:
            await probe_subscription(self._client, self._channel_pattern())

    async def start(self, tg: anyio.abc.TaskGroup) -> None:
        if self._mode is ClusterMode.NONE:
            await self.ensure_keyspace_events()
            tg.start_soon(self._subscriber_loop)
        elif self._watcher is not None:
            await tg.start(self._watcher.run)
        tg.start_soon(self._sweep_loop)
        tg.start_soon(self._scan_loop)

    # -- lease sweep ---------------------------------------------------------------

    def wake_sweep(self) -> None:
        self._wake.set()

    async def sweep_once(self, horizon_ms: int = 0) -> int:
        """Recover assignments whose lease is due; returns how many were looked at."""
        recheck_ms = max(100, self._consumer.lock_ttl_ms // 2)
        due = await self._gw.liveness.sweep_leases(horizon_ms, _SWEEP_LIMIT, recheck_ms)
        await self._recover_all([(a, "", deadline_ms) for a, deadline_ms in due])
        sessions = await self._gw.liveness.sweep_sessions(_SWEEP_LIMIT, recheck_ms)
        for member, deadline_ms in sessions:
            await self._recover_session(member, deadline_ms)
        return max(len(due), len(sessions))

    async def _recover_session(self, member: str, deadline_ms: int) -> None:
        """Recover what a consumer session that fell due held (``Liveness.SESSION``).

        A session still alive (its heartbeat is late, or the member was pushed ahead by
        another sweeper) is left alone: its next renewal writes its true deadline. A
        dead one has each assignment pending under its consumer name re-queued unless
        its lock is alive (a later incarnation under the same name holds it); then the
        member goes. Entries pending for less than ``_SESSION_MIN_IDLE_MS`` are left to
        a later pass: a live incarnation under the same name is still taking their lock.
        """
        parsed = parse_session_member(member)
        if parsed is None:
            return  # not written by streamjobs: left alone
        incarnation, consumer = parsed
        try:
            if await self._gw.liveness.session_alive(consumer, incarnation):
                return
            start, fresh, failed = "-", False, False
            while True:
                page = await self._gw.assignments.pending_page(0, start, _SWEEP_LIMIT, consumer)
                fresh = fresh or any(p.idle_ms < _SESSION_MIN_IDLE_MS for p in page)
                # The fresh ones are looked at again after the re-check delay.
                failed |= not await self._recover_all(
                    [
                        (p.id, consumer, deadline_ms)
                        for p in page
                        if p.idle_ms >= _SESSION_MIN_IDLE_MS
                    ]
                )
                if len(page) < _SWEEP_LIMIT:
                    break
                start = "(" + page[-1].id
            # The member stays while anything is left to do: the sweep hands it out
            # again after its re-check delay. Dropping it after a failed recovery
            # would leave that assignment to the scan, which skips it while its lease
            # (the long session-mode lock TTL) lies ahead: minutes, not seconds.
            if not fresh and not failed:
                await self._gw.liveness.session("forget", consumer, incarnation, 0, incarnation)
        except Exception as exc:
            self._metrics.loop_error(self._service, "recover")
            log_failure(log, f"recovering the session of consumer {consumer!r}", exc, 0.0)

    async def _recover_all(self, items: list[tuple[str, str, int]]) -> bool:
        """Recover (assignment id, owner, lost-at ms) items, ``_RECOVERY_CONCURRENCY`` at
        a time, about in their order (the sweep hands them out by deadline). True if
        every one was recovered without an error."""
        ok = True
        if len(items) <= 1:
            for assignment_id, owner, lost_at_ms in items:
                ok &= await self._recover_one(assignment_id, owner, lost_at_ms)
            return ok
        queue = iter(items)

        async def worker() -> None:
            nonlocal ok
            for assignment_id, owner, lost_at_ms in queue:  # shared: each item once
                ok &= await self._recover_one(assignment_id, owner, lost_at_ms)

        async with anyio.create_task_group() as tg:
            for _ in range(min(_RECOVERY_CONCURRENCY, len(items))):
                tg.start_soon(worker)
        return ok

    async def _recover_one(
        self, assignment_id: str, owner: str, lost_at_ms: int | None = None
    ) -> bool:
        """Recover one assignment; a failure is logged and counted, never stops a pass.

        One entry that cannot be recovered (whatever the reason) must not keep the
        ones behind it from being recovered. The sweep hands the id out again after
        its re-check delay, and the scan finds it on a later pass.
        """
        try:
            await self._recoverer.recover(assignment_id, owner=owner, lost_at_ms=lost_at_ms)
        except Exception as exc:
            self._metrics.loop_error(self._service, "recover")
            log_failure(log, f"recovering assignment {assignment_id}", exc, 0.0)
            return False
        return True

    async def _sweep_loop(self) -> None:
        guard = LoopGuard("sweep", self._service, self._metrics, log)
        interval = self._cfg.lease_check_interval_s
        # Lease deadlines trail lock deadlines by a round trip; a woken sweep looks a
        # little ahead so the lock that just expired is included.
        horizon_ms = 250
        delay = 0.0  # a first sweep at once: whatever fell due while nobody ran
        while True:
            woken = False
            with anyio.move_on_after(delay):
                await self._wake.wait()
                woken = True
            if woken:
                self._wake = anyio.Event()
                delay = self._rng.uniform(0, self._cfg.notification_delay_max_s)
                await anyio.sleep(delay)
            delay = interval
            try:
                while await self.sweep_once(horizon_ms if woken else 0) == _SWEEP_LIMIT:
                    pass
                delay = await self._until_next_due(interval)
                guard.ok()
            except Exception as exc:
                await guard.failed(exc, "lease sweep")

    async def _until_next_due(self, interval: float) -> float:
        """How long the sweep may sleep: until the earliest lease or session deadline
        (plus a few ms of jitter, so a fleet does not sweep in step), at most
        ``interval``. A dead owner is then recovered as its deadline passes, not up to
        one interval later, whether or not Redis has expired its lock yet."""
        due_ms = await self._gw.liveness.next_due_ms()
        if due_ms is None:
            return interval
        return min(interval, due_ms / 1000 + self._rng.uniform(*_DUE_SLACK_S))

    # -- reconciliation scan -------------------------------------------------------

    async def scan_once(self, cursor: str | None = None) -> tuple[int, str]:
        """One XPENDING page after ``cursor`` (default: this consumer's own).

        Returns:
            (entries recovered or tried, the cursor after the page: '-' at the end).
        """
        cfg = self._cfg
        start = self._cursor if cursor is None else cursor
        page = await self._gw.assignments.pending_page(
            round(cfg.min_idle_s * 1000), start, cfg.batch_size
        )
        self.inspected += len(page)
        after = "-" if len(page) < cfg.batch_size else f"({page[-1].id}"
        self._cursor = after
        if not page:
            return 0, after
        scores = await self._gw.assignments.lease_scores([p.id for p in page])
        now_ms = await self._gw.assignments.server_time_ms()
        tried = 0
        # A lease more than a couple of lock TTLs ahead is a session-mode one (it runs
        # to the long lock TTL): it says nothing about the owner, whose session may be
        # dead, so the lock's liveness decides (the recoverer skips a live one). Skipping
        # those would leave a dead session's assignment, when its session index entry
        # is gone, to wait out that TTL (ten minutes or more).
        horizon_ms = 2 * self._consumer.lock_ttl_ms
        for entry, score in zip(page, scores, strict=True):
            if score is not None and now_ms < score <= now_ms + horizon_ms:
                continue  # a live lease: the sweep will look at it when it is due
            await self._recover_one(entry.id, entry.consumer, None if score is None else int(score))
            tried += 1
        return tried, after

    async def scan_pass(self) -> int | None:
        """The reconciliation pass of one interval, if this consumer wins its lease.

        One consumer per service per interval scans (``SET NX PX`` on the scan lease),
        from the cursor kept in Redis, page after page until the end of the pending
        list or ``scan_budget_s``; the cursor is saved after every page, so the next
        pass (whoever runs it) goes on from there. Returns the pages read, or None if
        another consumer holds this interval's lease.
        """
        cfg = self._cfg
        if not await self._gw.liveness.take_scan_lease(self._name, round(cfg.interval_s * 1000)):
            return None
        began = time.monotonic()
        deadline = began + cfg.scan_budget_s
        self.inspected = 0
        cursor = await self._gw.liveness.scan_cursor()
        pages = 0
        while True:
            _, cursor = await self.scan_once(cursor)
            await self._gw.liveness.save_scan_cursor(cursor)
            pages += 1
            if cursor == "-" or time.monotonic() >= deadline:
                self._metrics.scan_pass(self._service, time.monotonic() - began, self.inspected)
                return pages

    async def _scan_loop(self) -> None:
        guard = LoopGuard("scan", self._service, self._metrics, log)
        while True:
            try:
                await self.scan_pass()
            except Exception as exc:
                await guard.failed(exc, "reconciliation scan")
                continue
            guard.ok()
            await self.prune_consumers()
            await anyio.sleep(
                self._cfg.interval_s * (1 + self._rng.uniform(0, self._cfg.jitter_fraction))
            )

    async def prune_consumers(self) -> list[str]:
        """Forget consumer names of the assignment group that are gone (every process
        start adds one). Only names with nothing pending and idle ``min_idle_s`` go, in
        one script, so a live consumer loses nothing: its next read re-creates it."""
        try:
            gone = await self._gw.liveness.prune_consumers(
                round(self._cfg.min_idle_s * 1000), self._name
            )
        except Exception as exc:
            self._metrics.loop_error(self._service, "prune")
            log_failure(log, "pruning consumer names", exc, 0.0)
            return []
        if gone:
            log.info("forgot %d consumer name(s) no longer in use: %s", len(gone), gone[:10])
        return gone

    # -- keyspace notifications ------------------------------------------------------

    async def ensure_keyspace_events(self, client: Any = None) -> bool:
        """Merge the needed flags into ``notify-keyspace-events`` (see ``_notifications``)."""
        return await ensure_keyspace_events(
            client or self._client,
            self._cfg.keyspace_flags,
            configure=self._cfg.configure_keyspace_events,
        )

    def _channel_pattern(self) -> str:
        # The client's database, on a cluster too: Valkey 9 allows numbered databases
        # there (redis-py's cluster client has only 0 today, which this then reads).
        return f"__keyspace@{client_db(self._client)}__:{self._gw.keys.lock_pattern}"

    async def reset_topology(self) -> None:
        """See ``StreamConsumer.reset_topology``."""
        if self._watcher is not None:
            await self._watcher.reset()

    @property
    def watcher(self) -> ClusterWatcher | None:
        return self._watcher

    async def _subscriber_loop(self) -> None:
        backoff = Backoff()
        pattern = self._channel_pattern()
        first = True
        while True:
            began = time.monotonic()
            subscribed = False
            try:
                if not first:
                    # A server restarted without persistence forgot the flags; set
                    # them again on every re-subscription (a no-op when they are set).
                    await self.ensure_keyspace_events()
                first = False
                async with anyio.create_task_group() as tg:
                    await tg.start(
                        subscribe,
                        self._client,
                        pattern,
                        self.wake_sweep,
                        self._metrics,
                        self._service,
                    )
                    subscribed = True
                    self._metrics.keyspace_setup(self._service, "ok")
                    # Events may have been missed while we were not subscribed.
                    self.wake_sweep()
            except Exception as exc:  # refused, connection lost, or a slow subscriber
                if not subscribed:
                    self._metrics.keyspace_setup(self._service, "failed")
                if time.monotonic() - began >= _STABLE_SUBSCRIPTION_S:
                    backoff.reset()  # it had worked: come back quickly
                delay = backoff.next_delay()
                self._metrics.notification(self._service, "dropped")
                self._metrics.loop_error(self._service, "subscriber")
                log.warning(
                    "keyspace subscription failed (%s); re-subscribing in %.1fs",
                    describe(exc),
                    delay,
                )
                await anyio.sleep(delay)
