"""Instrumentation protocol.

Every event streamjobs reports goes through a :class:`MetricsRecorder`. The
default :class:`NullRecorder` does nothing; pass your own implementation as
``StreamConsumer(metrics=...)`` to export them, or use
:class:`~streamjobs.PrometheusRecorder`. Labels are bounded sets: a service name, an
outcome or a reason, never a stream name or an entry id. Calls are made from the
event loop thread and must not block.

A recorder of your own should subclass :class:`NullRecorder` and override what it
needs: methods added by later versions then default to doing nothing. One that does
not subclass it still works; the methods it lacks are skipped.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from ._dlq_reason import DeadLetterReason
from .exceptions import ConfigurationError


class StreamEvent(enum.Enum):
    """What happened to an owned stream."""

    ACQUIRED = "acquired"
    """The lock was taken and processing started."""
    FINISHED = "finished"
    """The end-of-stream marker was handled and the assignment completed."""
    LOST = "lost"
    """The lock expired or was taken over (disowned)."""
    HANDED_BACK = "handed_back"
    """Shutdown re-queued the unfinished stream for another consumer."""
    CONTENDED = "contended"
    """The lock was held by someone else when the assignment arrived."""
    VANISHED = "vanished"
    """The data stream was deleted or expired while owned; its assignment was completed."""
    CANCELLED = "cancelled"
    """``Producer.cancel_stream`` ended it: the rest was discarded, the assignment done."""


class EntryOutcome(enum.Enum):
    """How a data entry was done with."""

    OK = "ok"
    """``handle()`` returned on the first attempt."""
    RETRIED = "retried"
    """``handle()`` returned after one or more failed attempts."""
    DEAD_LETTERED = "dead_lettered"
    """Every attempt failed (or ``DeadLetter`` was raised): it went to the DLQ."""


class RequeueOutcome(enum.Enum):
    """Result of trying to recover one pending assignment."""

    REQUEUED = "requeued"
    DEAD_LETTERED = "dead_lettered"
    OWNER_ALIVE = "owner_alive"
    LOST_RACE = "lost_race"


@runtime_checkable
class MetricsRecorder(Protocol):
    """Receives every event a consumer reports. All methods must be cheap and non-blocking."""

    def stream_event(self, service: str, event: StreamEvent) -> None:
        """An owned stream changed state."""

    def entries_handled(
        self, service: str, outcome: EntryOutcome, durations: Sequence[float]
    ) -> None:
        """Data entries were done with, one duration (seconds) each.

        For ``OK`` the time ``handle()`` took; for ``RETRIED`` and ``DEAD_LETTERED``
        the time from the first attempt until the entry was done, backoff included.
        """

    def handler_failed(self, service: str) -> None:
        """One handler attempt raised."""

    def dead_lettered(self, service: str, reason: DeadLetterReason) -> None:
        """One entry (assignment or data) was written to the dead-letter stream."""

    def requeue(self, service: str, outcome: RequeueOutcome) -> None:
        """One recovery attempt of a pending assignment ended with ``outcome``."""

    def recovery_latency(self, service: str, seconds: float) -> None:
        """A recovered stream was resumed: ``seconds`` since its previous owner was lost
        (its lock's deadline; measured on the Redis server's clock)."""

    def heartbeat(self, service: str, ok: bool) -> None:
        """One lock extension round finished (``ok`` False: Redis error)."""

    def loop_error(self, service: str, loop: str) -> None:
        """A background loop (``intake``, ``heartbeat``, ``stream``, ...) hit an error."""

    def owned_streams(self, service: str, count: int) -> None:
        """The number of streams this consumer owns changed."""

    def notification(self, service: str, outcome: str) -> None:
        """A keyspace event arrived (``expired``) or events may have been lost (``dropped``)."""

    def dlq_trimmed(self, service: str, count: int) -> None:
        """``count`` old entries were trimmed off the dead-letter stream by MAXLEN."""

    def scan_pass(self, service: str, seconds: float, inspected: int) -> None:
        """A reconciliation pass ended: its duration and the pending entries it read."""

    def keyspace_setup(self, service: str, result: str) -> None:
        """One node's keyspace subscription was set up (``ok``) or refused (``failed``)."""

    def topology_reset(self, service: str, result: str) -> None:
        """A cluster topology reset ended: ``ok``, ``not_settled`` or ``failed``."""

    def service_sampled(self, service: str, sample: ServiceSample) -> None:
        """The service's queue was sampled (every ``ConsumerConfig.sample_interval_s``)."""

    def entries_reclaimed(self, service: str, count: int) -> None:
        """A ``GroupConsumer`` claimed ``count`` entries pending under members that died
        or stopped (or under names without a session, after ``min_idle_s``)."""

    def stream_trimmed(self, service: str, acknowledged: int, dropped: int) -> None:
        """A ``GroupConsumer`` trimmed a stream: ``acknowledged`` entries every group had
        acknowledged, ``dropped`` entries a cap removed at or above the oldest
        unacknowledged one (``GroupRetention``)."""


@dataclass(frozen=True, slots=True)
class ServiceSample:
    """What a periodic sample of a service's Redis state found."""

    pending: int
    """Assignments delivered and not yet finished (owned, or awaiting recovery)."""
    oldest_pending_age_s: float
    """Age of the oldest of them, from its entry id (0 if none)."""
    dlq_length: int
    """Entries in the dead-letter stream."""
    consumers: int
    """Consumer names in the assignment group (live, or not yet pruned)."""


class NullRecorder:
    """A recorder that records nothing (the default); subclass it to record some."""

    def stream_event(self, service: str, event: StreamEvent) -> None:
        pass

    def entries_handled(
        self, service: str, outcome: EntryOutcome, durations: Sequence[float]
    ) -> None:
        pass

    def handler_failed(self, service: str) -> None:
        pass

    def dead_lettered(self, service: str, reason: DeadLetterReason) -> None:
        pass

    def requeue(self, service: str, outcome: RequeueOutcome) -> None:
        pass

    def recovery_latency(self, service: str, seconds: float) -> None:
        pass

    def heartbeat(self, service: str, ok: bool) -> None:
        pass

    def loop_error(self, service: str, loop: str) -> None:
        pass

    def owned_streams(self, service: str, count: int) -> None:
        pass

    def notification(self, service: str, outcome: str) -> None:
        pass

    def dlq_trimmed(self, service: str, count: int) -> None:
        pass

    def scan_pass(self, service: str, seconds: float, inspected: int) -> None:
        pass

    def keyspace_setup(self, service: str, result: str) -> None:
        pass

    def topology_reset(self, service: str, result: str) -> None:
        pass

    def service_sampled(self, service: str, sample: ServiceSample) -> None:
        pass

    def entries_reclaimed(self, service: str, count: int) -> None:
        pass

    def stream_trimmed(self, service: str, acknowledged: int, dropped: int) -> None:
        pass


EVENTS: tuple[str, ...] = tuple(
    name for name, value in vars(NullRecorder).items() if callable(value) and name[0] != "_"
)
"""Every method of the protocol."""


def complete(recorder: Any) -> MetricsRecorder:
    """``recorder``, or a wrapper of it answering the methods it lacks with nothing.

    A recorder written against an older protocol keeps working; a method the
    framework calls always exists.

    Raises:
        ConfigurationError: for field ``metrics``: it has none of the methods.
    """
    missing = [name for name in EVENTS if not callable(getattr(recorder, name, None))]
    if not missing:
        return recorder  # type: ignore[no-any-return]
    if len(missing) == len(EVENTS):
        raise ConfigurationError(
            "metrics",
            "must implement MetricsRecorder (subclass NullRecorder), got "
            f"{type(recorder).__name__}",
        )
    return _Completed(recorder, missing)


class _Completed(NullRecorder):
    def __init__(self, inner: Any, missing: Sequence[str]) -> None:
        for name in EVENTS:
            if name not in missing:
                setattr(self, name, getattr(inner, name))
