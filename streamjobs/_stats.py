"""What ``StreamConsumer.statistics()`` reports: counts kept from the recorder events.

Every event the runtime reports goes through a :class:`Tally`, which counts it and
passes it on to the user's recorder. Counting is a dict increment per event (the hot
path reports once per read batch), so the snapshot costs nothing when nobody asks.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ._dlq_reason import DeadLetterReason
from .metrics import (
    EntryOutcome,
    MetricsRecorder,
    RequeueOutcome,
    ServiceSample,
    StreamEvent,
)


@dataclass(frozen=True, slots=True)
class ConsumerStatistics:
    """A snapshot of one consumer, from ``StreamConsumer.statistics()``.

    Times are wall-clock seconds since the epoch (``time.time()``), None if it never
    happened. Counts are since this consumer object was made.
    """

    service: str
    consumer: str
    running: bool
    """``run()`` is running and its loops have started."""
    healthy: bool
    """Running, and its event loop is turning (what ``/healthz`` answers)."""
    ready: bool
    """Healthy, Redis answered lately and the group exists (what ``/readyz`` answers)."""
    owned_streams: int
    in_flight_handlers: int
    """Streams in the middle of a batch of ``handle()`` calls (retries included)."""
    last_redis_ok_at: float | None
    """The last time a command of this consumer got a reply."""
    last_scan_at: float | None
    """The last time a reconciliation pass of this consumer ended."""
    entries: Mapping[str, int]
    """Data entries done with, by :class:`~streamjobs.EntryOutcome` value."""
    stream_events: Mapping[str, int]
    """By :class:`~streamjobs.StreamEvent` value."""
    recoveries: Mapping[str, int]
    """Recovery attempts, by :class:`~streamjobs.RequeueOutcome` value."""
    dead_letters: Mapping[str, int]
    """By :class:`~streamjobs.DeadLetterReason` value."""
    handler_failures: int
    heartbeats_failed: int
    loop_errors: Mapping[str, int]
    """By loop name."""
    notifications: Mapping[str, int]
    """Keyspace notifications by outcome."""
    scan_passes: int
    """Reconciliation passes (a ``GroupConsumer``: reclaim passes, one per stream)."""
    entries_reclaimed: int = 0
    """A ``GroupConsumer``: entries it claimed from dead or stopped members."""
    entries_trimmed: int = 0
    """A ``GroupConsumer``: acknowledged entries it trimmed from its streams."""
    entries_dropped: int = 0
    """A ``GroupConsumer``: entries a retention cap trimmed unacknowledged."""


class Tally:
    """Counts every event, then hands it to ``inner`` (the user's recorder)."""

    def __init__(self, inner: MetricsRecorder) -> None:
        self.inner = inner
        self.entries: Counter[str] = Counter()
        self.stream_events: Counter[str] = Counter()
        self.recoveries: Counter[str] = Counter()
        self.dead_letters: Counter[str] = Counter()
        self.loop_errors: Counter[str] = Counter()
        self.notifications: Counter[str] = Counter()
        self.handler_failures = 0
        self.heartbeats_failed = 0
        self.scan_passes = 0
        self.last_scan_at: float | None = None
        self.reclaimed = 0
        self.trimmed = 0
        self.dropped = 0

    def statistics(
        self,
        *,
        service: str,
        consumer: str,
        running: bool,
        healthy: bool,
        ready: bool,
        owned_streams: int,
        in_flight_handlers: int,
        last_redis_ok: float | None,
    ) -> ConsumerStatistics:
        """A snapshot of these counts, with what only the runtime knows
        (``last_redis_ok``: a ``time.monotonic()`` instant, reported as wall clock)."""
        return ConsumerStatistics(
            service=service,
            consumer=consumer,
            running=running,
            healthy=healthy,
            ready=ready,
            owned_streams=owned_streams,
            in_flight_handlers=in_flight_handlers,
            last_redis_ok_at=None
            if last_redis_ok is None
            else time.time() - (time.monotonic() - last_redis_ok),
            last_scan_at=self.last_scan_at,
            entries=dict(self.entries),
            stream_events=dict(self.stream_events),
            recoveries=dict(self.recoveries),
            dead_letters=dict(self.dead_letters),
            handler_failures=self.handler_failures,
            heartbeats_failed=self.heartbeats_failed,
            loop_errors=dict(self.loop_errors),
            notifications=dict(self.notifications),
            scan_passes=self.scan_passes,
            entries_reclaimed=self.reclaimed,
            entries_trimmed=self.trimmed,
            entries_dropped=self.dropped,
        )

    def stream_event(self, service: str, event: StreamEvent) -> None:
        self.stream_events[event.value] += 1
        self.inner.stream_event(service, event)

    def entries_handled(
        self, service: str, outcome: EntryOutcome, durations: Sequence[float]
    ) -> None:
        self.entries[outcome.value] += len(durations)
        self.inner.entries_handled(service, outcome, durations)

    def handler_failed(self, service: str) -> None:
        self.handler_failures += 1
        self.inner.handler_failed(service)

    def dead_lettered(self, service: str, reason: DeadLetterReason) -> None:
        self.dead_letters[reason.value] += 1
        self.inner.dead_lettered(service, reason)

    def requeue(self, service: str, outcome: RequeueOutcome) -> None:
        self.recoveries[outcome.value] += 1
        self.inner.requeue(service, outcome)

    def recovery_latency(self, service: str, seconds: float) -> None:
        self.inner.recovery_latency(service, seconds)

    def heartbeat(self, service: str, ok: bool) -> None:
        if not ok:
            self.heartbeats_failed += 1
        self.inner.heartbeat(service, ok)

    def loop_error(self, service: str, loop: str) -> None:
        self.loop_errors[loop] += 1
        self.inner.loop_error(service, loop)

    def owned_streams(self, service: str, count: int) -> None:
        self.inner.owned_streams(service, count)

    def notification(self, service: str, outcome: str) -> None:
        self.notifications[outcome] += 1
        self.inner.notification(service, outcome)

    def dlq_trimmed(self, service: str, count: int) -> None:
        self.inner.dlq_trimmed(service, count)

    def entries_reclaimed(self, service: str, count: int) -> None:
        self.reclaimed += count
        self.inner.entries_reclaimed(service, count)

    def stream_trimmed(self, service: str, acknowledged: int, dropped: int) -> None:
        self.trimmed += acknowledged
        self.dropped += dropped
        self.inner.stream_trimmed(service, acknowledged, dropped)

    def reclaim_pass(self) -> None:
        """A ``GroupConsumer`` reclaim pass of one stream ended (counted here only: the
        recorder's ``scan_pass`` is the assignment scan's)."""
        self.scan_passes += 1
        self.last_scan_at = time.time()

    def scan_pass(self, service: str, seconds: float, inspected: int) -> None:
        self.scan_passes += 1
        self.last_scan_at = time.time()
        self.inner.scan_pass(service, seconds, inspected)

    def keyspace_setup(self, service: str, result: str) -> None:
        self.inner.keyspace_setup(service, result)

    def topology_reset(self, service: str, result: str) -> None:
        self.inner.topology_reset(service, result)

    def service_sampled(self, service: str, sample: ServiceSample) -> None:
        self.inner.service_sampled(service, sample)
