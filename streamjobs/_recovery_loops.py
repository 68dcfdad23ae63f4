"""The background loops that find dead owners (SPEC §4); see docs/recovery.md.

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
from typing import Any

import anyio
import anyio.abc

from ._backoff import Backoff
from ._notifications import ClusterWatcher, subscribe
from ._recovery import Recoverer
from ._redis import REDIS_FAILURES, Gateway, text, translated
from .config import ClusterMode, ConsumerConfig, RecoveryConfig
from .metrics import MetricsRecorder

log = logging.getLogger("streamjobs.recovery")

_SWEEP_LIMIT = 100


def merge_flags(current: str, needed: str) -> str | None:
    """The ``notify-keyspace-events`` value with ``needed`` merged in, or None if no change.

    ``A`` is an alias for ``g$lshzxetd`` (and more on newer servers), so it already
    covers ``x``; ``K``/``E`` are never implied by ``A``.
    """
    have = set(current)
    alias_a = set("g$lshzxetd")
    missing = [f for f in needed if f not in have and not ("A" in have and f in alias_a)]
    if not missing:
        return None
    return current + "".join(missing)


class RecoveryLoops:
    """Runs the recovery loops of one consumer."""

    def __init__(
        self,
        client: Any,
        gateway: Gateway,
        recoverer: Recoverer,
        *,
        recovery: RecoveryConfig,
        consumer: ConsumerConfig,
        cluster_mode: ClusterMode,
        metrics: MetricsRecorder,
        rng: random.Random | None = None,
    ) -> None:
        self._client = client
        self._gw = gateway
        self._recoverer = recoverer
        self._cfg = recovery
        self._consumer = consumer
        self._mode = cluster_mode
        self._metrics = metrics
        self._rng = rng or random.Random()
        self._service = gateway.keys.service
        self._wake = anyio.Event()
        self._cursor = "-"
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
        due = await self._gw.sweep_leases(horizon_ms, _SWEEP_LIMIT, recheck_ms)
        for assignment_id in due:
            await self._recoverer.recover(assignment_id)
        return len(due)

    async def _sweep_loop(self) -> None:
        backoff = Backoff()
        interval = self._cfg.lease_check_interval_s
        # Lease deadlines trail lock deadlines by a round trip; a woken sweep looks a
        # little ahead so the lock that just expired is included.
        horizon_ms = 250
        while True:
            woken = False
            with anyio.move_on_after(interval):
                await self._wake.wait()
                woken = True
            if woken:
                self._wake = anyio.Event()
                delay = self._rng.uniform(0, self._cfg.notification_delay_max_s)
                await anyio.sleep(delay)
            try:
                while await self.sweep_once(horizon_ms if woken else 0) == _SWEEP_LIMIT:
                    pass
                backoff.reset()
            except REDIS_FAILURES as exc:
                self._metrics.loop_error(self._service, "sweep")
                log.warning("lease sweep failed (%s)", exc)
                await anyio.sleep(backoff.next_delay())

    # -- reconciliation scan -------------------------------------------------------

    async def scan_once(self) -> int:
        """One XPENDING page from the cursor; returns how many entries it recovered or tried."""
        cfg = self._cfg
        page = await self._gw.pending_page(
            round(cfg.min_idle_s * 1000), self._cursor, cfg.batch_size
        )
        self._cursor = "-" if len(page) < cfg.batch_size else f"({page[-1].id}"
        if not page:
            return 0
        scores = await self._gw.lease_scores([p.id for p in page])
        now_ms = await self._gw.server_time_ms()
        tried = 0
        for entry, score in zip(page, scores, strict=True):
            if score is not None and score > now_ms:
                continue  # a live lease: the sweep will look at it when it is due
            await self._recoverer.recover(entry.id, owner=entry.consumer)
            tried += 1
        return tried

    async def _scan_loop(self) -> None:
        backoff = Backoff()
        while True:
            try:
                await self.scan_once()
                backoff.reset()
                wait = self._cfg.interval_s * (1 + self._rng.uniform(0, self._cfg.jitter_fraction))
            except REDIS_FAILURES as exc:
                self._metrics.loop_error(self._service, "scan")
                log.warning("reconciliation scan failed (%s)", exc)
                wait = backoff.next_delay()
            await anyio.sleep(wait)

    # -- keyspace notifications ------------------------------------------------------

    @translated
    async def ensure_keyspace_events(self, client: Any = None) -> bool:
        """Make sure ``notify-keyspace-events`` has our flags; True if they are set.

        Merges with the flags already set (never drops one somebody else needs). With
        ``configure_keyspace_events=False`` it never runs CONFIG SET and only warns.
        """
        client = client or self._client
        try:
            current = text(
                (await client.config_get("notify-keyspace-events")).get(
                    "notify-keyspace-events", ""
                )
                or ""
            )
        except Exception as exc:  # CONFIG may be renamed or forbidden on managed Redis
            log.warning("cannot read notify-keyspace-events (%s): relying on the scanner", exc)
            return False
        merged = merge_flags(current, self._cfg.keyspace_flags)
        if merged is None:
            return True
        if not self._cfg.configure_keyspace_events:
            log.warning(
                "notify-keyspace-events is %r and lacks %r; not changing it "
                "(configure_keyspace_events=False): recovery relies on the scanner",
                current,
                self._cfg.keyspace_flags,
            )
            return False
        try:
            await client.config_set("notify-keyspace-events", merged)
        except Exception as exc:
            log.warning("cannot set notify-keyspace-events (%s): relying on the scanner", exc)
            return False
        return True

    def _channel_pattern(self) -> str:
        if self._mode is ClusterMode.OSS:
            db = 0  # a cluster has only database 0
        else:
            db = self._client.connection_pool.connection_kwargs.get("db", 0)
        return f"__keyspace@{db}__:{self._gw.keys.lock_pattern}"

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
        while True:
            try:
                async with anyio.create_task_group() as tg:
                    await tg.start(
                        subscribe,
                        self._client,
                        pattern,
                        self.wake_sweep,
                        self._metrics,
                        self._service,
                    )
                    backoff.reset()
                    # Events may have been missed while we were not subscribed.
                    self.wake_sweep()
            except Exception as exc:  # connection lost, or killed as a slow subscriber
                self._metrics.notification(self._service, "dropped")
                self._metrics.loop_error(self._service, "subscriber")
                log.warning("keyspace subscription lost (%s); re-subscribing", exc)
                await anyio.sleep(backoff.next_delay())
