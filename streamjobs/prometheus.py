"""A :class:`~streamjobs.MetricsRecorder` that exports to Prometheus.

Every metric is listed, with its type, labels, meaning and a suggested alert, in
METRICS.md at the top of the repository (a test keeps the two in step). Labels are
bounded sets (the service, an event, an outcome, a reason, a loop), never a stream
name, an entry id or a consumer name.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from ._deadletter import DeadLetterReason
from .metrics import RequeueOutcome, StreamEvent


class PrometheusRecorder:
    """Counts what consumers report into Prometheus metrics.

    Args:
        registry: where the metrics are registered. By default a new, private
            :class:`prometheus_client.CollectorRegistry` (the global one is used only
            when passed explicitly, as ``prometheus_client.REGISTRY``), so two recorders
            never clash. Expose it with ``prometheus_client.generate_latest(registry)``.
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
        self._entries = Counter(
            "entries_handled", "Data entries done with (handled, or dead-lettered)", ["service"],
            namespace=ns, registry=reg,
        )  # fmt: skip
        self._handler_seconds = Counter(
            "handler_seconds", "Time spent handling the entries done with", ["service"],
            namespace=ns, registry=reg,
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
        self._recoveries = Counter(
            "recoveries", "Recovery attempts of pending assignments", ["service", "outcome"],
            namespace=ns, registry=reg,
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

    def stream_event(self, service: str, event: StreamEvent) -> None:
        self._events.labels(service, event.value).inc()

    def entries_handled(self, service: str, count: int, seconds: float) -> None:
        self._entries.labels(service).inc(count)
        self._handler_seconds.labels(service).inc(seconds)

    def handler_failed(self, service: str) -> None:
        self._handler_failures.labels(service).inc()

    def dead_lettered(self, service: str, reason: DeadLetterReason) -> None:
        self._dead_letters.labels(service, reason.value).inc()

    def requeue(self, service: str, outcome: RequeueOutcome) -> None:
        self._recoveries.labels(service, outcome.value).inc()

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
