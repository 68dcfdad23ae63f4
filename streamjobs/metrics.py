"""Instrumentation protocol.

Every event streamjobs reports goes through a :class:`MetricsRecorder`. The
default :class:`NullRecorder` does nothing; pass your own implementation as
``StreamConsumer(metrics=...)`` to export them. Labels are bounded sets: a service
name, an outcome or a reason — never a stream name or an entry id. Calls are made
from the event loop thread and must not block.
"""

from __future__ import annotations

import enum
from typing import Protocol, runtime_checkable

from ._deadletter import DeadLetterReason


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

    def entries_handled(self, service: str, count: int, seconds: float) -> None:
        """``count`` entries were handled successfully, taking ``seconds`` in handlers."""

    def handler_failed(self, service: str) -> None:
        """One handler attempt raised."""

    def dead_lettered(self, service: str, reason: DeadLetterReason) -> None:
        """One entry (assignment or data) was written to the dead-letter stream."""

    def requeue(self, service: str, outcome: RequeueOutcome) -> None:
        """One recovery attempt of a pending assignment ended with ``outcome``."""

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


class NullRecorder:
    """A recorder that records nothing (the default)."""

    def stream_event(self, service: str, event: StreamEvent) -> None:
        pass

    def entries_handled(self, service: str, count: int, seconds: float) -> None:
        pass

    def handler_failed(self, service: str) -> None:
        pass

    def dead_lettered(self, service: str, reason: DeadLetterReason) -> None:
        pass

    def requeue(self, service: str, outcome: RequeueOutcome) -> None:
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
