"""A :class:`~streamjobs.MetricsRecorder` that exports to Prometheus.

Every metric is listed, with its type, labels, meaning and a suggested alert, in
METRICS.md at the top of the repository (a test keeps the two in step). Labels are
bounded sets (the service, an event, an outcome, a reason, a result, a loop), never
a stream name, an entry id or a consumer name.
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from ._dlq_reason import DeadLetterReason
from .metrics import EntryOutcome, RequeueOutcome, ServiceSample, StreamEvent

HANDLING_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    30.0, 60.0, 300.0,
)  # fmt: skip
"""Seconds: from sub-millisecond handlers to ones that hold a stream for minutes."""

RECOVERY_BUCKETS = (
    0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 7.5, 10.0, 12.5, 15.0, 20.0, 30.0, 45.0, 60.0, 120.0,
    300.0, 600.0,
)  # fmt: skip
"""Seconds: dense around the usual lock TTLs (5 to 30 s), where the TTL + 1 s alert lies."""

SCAN_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
"""Seconds: a pass is bounded by ``RecoveryConfig.scan_budget_s`` (0.25 s by default)."""


class PrometheusRecorder:
    """Counts what consumers report into Prometheus metrics.

    Args:
        registry: where the metrics are registered. By default a new, private
            :class:`prometheus_client.CollectorRegistry` (the global one is used only
            when passed explicitly, as ``prometheus_client.REGISTRY``), so two recorders
            never clash. Expose it with ``prometheus_client.generate_latest(registry)``,
            or run the consumer with ``streamjobs worker --metrics-port``.
        namespace: prefix of every metric name.
    """

    def __init__(
        self, registry: CollectorRegistry | None = None, *, namespace: str = "streamjobs"
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        ns, reg = namespace, self.registry
        self._events = Counter(
            "stream_events", "Owned-stream state changes", ["service", "event"],
            namespace=ns, registry=reg,
        )  # fmt: skip
        self._handling = Histogram(
            "entry_handling_seconds", "Data entries done with, and how long each took",
            ["service", "outcome"], namespace=ns, registry=reg, buckets=HANDLING_BUCKETS,
        )  # fmt: skip
        self._handler_failures = Counter(
            "handler_failures", "handle() attempts that raised", ["service"],
            namespace=ns, registry=reg,
        )  # fmt: skip
        self._dead_letters = Counter(
            "dead_letters", "Entries written to the dead-letter stream", ["service", "reason"],
            namespace=ns, registry=reg,
        )  # fmt: skip
        self._dead_letters_trimmed = Counter(
            "dead_letters_trimmed", "Old dead letters trimmed off by MAXLEN", ["service"],
            namespace=ns, registry=reg,
        )  # fmt: skip
        self._reclaimed = Counter(
            "group_entries_reclaimed", "Entries a GroupConsumer claimed from dead members",
            ["service"], namespace=ns, registry=reg,
        )  # fmt: skip
        self._trimmed = Counter(
            "group_entries_trimmed", "Acknowledged entries a GroupConsumer trimmed",
            ["service"], namespace=ns, registry=reg,
        )  # fmt: skip
        self._dropped = Counter(
            "group_entries_dropped", "Entries a GroupRetention cap trimmed unacknowledged",
            ["service"], namespace=ns, registry=reg,
        )  # fmt: skip
        self._recoveries = Counter(
            "recoveries", "Recovery attempts of pending assignments", ["service", "outcome"],
            namespace=ns, registry=reg,
        )  # fmt: skip
        self._recovery_latency = Histogram(
            "recovery_latency_seconds", "Previous owner lost to stream resumed elsewhere",
            ["service"], namespace=ns, registry=reg, buckets=RECOVERY_BUCKETS,
        )  # fmt: skip
        self._heartbeats = Counter(
            "heartbeats", "Lock-extension rounds", ["service", "result"],
            namespace=ns, registry=reg,
        )  # fmt: skip
        self._loop_errors = Counter(
            "loop_errors", "Errors caught by background loops", ["service", "loop"],
            namespace=ns, registry=reg,
        )  # fmt: skip
        self._notifications = Counter(
            "keyspace_notifications", "Keyspace events received, or possibly lost",
            ["service", "outcome"], namespace=ns, registry=reg,
        )  # fmt: skip
        self._owned = Gauge(
            "owned_streams", "Streams this process's consumers own", ["service"],
            namespace=ns, registry=reg,
        )  # fmt: skip
        self._scan_passes = Histogram(
            "scan_pass_seconds", "Reconciliation passes, and how long each took", ["service"],
            namespace=ns, registry=reg, buckets=SCAN_BUCKETS,
        )  # fmt: skip
        self._scan_inspected = Counter(
            "scan_entries_inspected", "Pending assignments read by reconciliation passes",
            ["service"], namespace=ns, registry=reg,
        )  # fmt: skip
        self._keyspace_setups = Counter(
            "keyspace_setups", "Keyspace subscriptions set up, per node", ["service", "result"],
            namespace=ns, registry=reg,
        )  # fmt: skip
        self._topology_resets = Counter(
            "topology_resets", "Cluster topology resets", ["service", "result"],
            namespace=ns, registry=reg,
        )  # fmt: skip
        self._pending = Gauge(
            "pending_assignments", "Assignments delivered and not finished (sampled)",
            ["service"], namespace=ns, registry=reg,
        )  # fmt: skip
        self._oldest_pending = Gauge(
            "oldest_pending_age_seconds", "Age of the oldest pending assignment (sampled)",
            ["service"], namespace=ns, registry=reg,
        )  # fmt: skip
        self._dlq_length = Gauge(
            "dlq_length", "Entries in the dead-letter stream (sampled)", ["service"],
            namespace=ns, registry=reg,
        )  # fmt: skip
        self._consumers = Gauge(
            "group_consumers", "Consumer names in the assignment group (sampled)", ["service"],
            namespace=ns, registry=reg,
        )  # fmt: skip

    def stream_event(self, service: str, event: StreamEvent) -> None:
        self._events.labels(service, event.value).inc()

    def entries_handled(
        self, service: str, outcome: EntryOutcome, durations: Sequence[float]
    ) -> None:
        observe = self._handling.labels(service, outcome.value).observe
        for seconds in durations:
            observe(seconds)

    def handler_failed(self, service: str) -> None:
        self._handler_failures.labels(service).inc()

    def dead_lettered(self, service: str, reason: DeadLetterReason) -> None:
        self._dead_letters.labels(service, reason.value).inc()

    def requeue(self, service: str, outcome: RequeueOutcome) -> None:
        self._recoveries.labels(service, outcome.value).inc()

    def recovery_latency(self, service: str, seconds: float) -> None:
        self._recovery_latency.labels(service).observe(seconds)

    def heartbeat(self, service: str, ok: bool) -> None:
        self._heartbeats.labels(service, "ok" if ok else "failed").inc()

    def loop_error(self, service: str, loop: str) -> None:
        self._loop_errors.labels(service, loop).inc()

    def owned_streams(self, service: str, count: int) -> None:
        self._owned.labels(service).set(count)

    def notification(self, service: str, outcome: str) -> None:
        self._notifications.labels(service, outcome).inc()

    def dlq_trimmed(self, service: str, count: int) -> None:
        self._dead_letters_trimmed.labels(service).inc(count)

    def entries_reclaimed(self, service: str, count: int) -> None:
        self._reclaimed.labels(service).inc(count)

    def stream_trimmed(self, service: str, acknowledged: int, dropped: int) -> None:
        if acknowledged:
            self._trimmed.labels(service).inc(acknowledged)
        if dropped:
            self._dropped.labels(service).inc(dropped)

    def scan_pass(self, service: str, seconds: float, inspected: int) -> None:
        self._scan_passes.labels(service).observe(seconds)
        self._scan_inspected.labels(service).inc(inspected)

    def keyspace_setup(self, service: str, result: str) -> None:
        self._keyspace_setups.labels(service, result).inc()

    def topology_reset(self, service: str, result: str) -> None:
        self._topology_resets.labels(service, result).inc()

    def service_sampled(self, service: str, sample: ServiceSample) -> None:
        self._pending.labels(service).set(sample.pending)
        self._oldest_pending.labels(service).set(sample.oldest_pending_age_s)
        self._dlq_length.labels(service).set(sample.dlq_length)
        self._consumers.labels(service).set(sample.consumers)
