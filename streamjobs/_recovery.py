"""Recovery of pending assignments whose owner is gone: a pure decision, then thin I/O.

The same primitive serves the keyspace-notification path, the lease sweep, the
XPENDING reconciliation scan and ``StreamConsumer.claim()``
(docs/design.md#recovery, docs/recovery.md).
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass

from . import _tracing
from ._deadletter import assignment_meta
from ._dlq_reason import DeadLetterReason
from ._redis._boundary import EntryTooLarge
from ._redis._protocol import StreamGateway
from ._redis._replies import RawFields
from ._wire import Assignment, parse_assignment, parse_retry_count
from .exceptions import InvalidAssignment
from .metrics import MetricsRecorder, RequeueOutcome

log = logging.getLogger(__name__)


class Action(enum.Enum):
    SKIP_ALIVE = "skip_alive"
    DEAD_LETTER = "dead_letter"
    REQUEUE = "requeue"


@dataclass(frozen=True, slots=True)
class Decision:
    action: Action
    reason: DeadLetterReason | None = None
    retry_count: int = 0
    error: str = ""


def decide(
    parsed: Assignment | InvalidAssignment, *, lock_exists: bool, max_retries: int, raw_retry: int
) -> Decision:
    """What to do with one pending assignment (pure).

    Args:
        parsed: the parsed entry, or why it could not be parsed.
        lock_exists: whether its stream's lock is alive: it exists and, if it names a
            session, that session is alive (ignored for unparseable entries:
            they are poison for everyone and have no lock to look at).
        max_retries: ``RecoveryConfig.max_retries``.
        raw_retry: the entry's ``_retry_count`` as far as it could be read (for the DLQ).
    """
    if isinstance(parsed, InvalidAssignment):
        return Decision(
            Action.DEAD_LETTER, DeadLetterReason.UNPARSEABLE, raw_retry, error=str(parsed)
        )
    if lock_exists:
        return Decision(Action.SKIP_ALIVE, retry_count=parsed.retry_count)
    nxt = parsed.retry_count + 1
    if nxt > max_retries:
        return Decision(Action.DEAD_LETTER, DeadLetterReason.MAX_RETRIES_EXCEEDED, nxt)
    return Decision(Action.REQUEUE, retry_count=nxt)


def _safe_retry(fields: RawFields) -> int:
    try:
        return parse_retry_count(fields)
    except InvalidAssignment:
        return 0


class Recoverer:
    """Carries out recovery decisions for one service."""

    def __init__(
        self,
        gateway: StreamGateway,
        *,
        max_retries: int,
        metrics: MetricsRecorder,
        service: str,
        consumer: str = "",
    ) -> None:
        self._gw = gateway
        self._max_retries = max_retries
        self._metrics = metrics
        self._service = service
        self._consumer = consumer

    def _extra(self, assignment_id: str, stream: str = "") -> dict[str, str]:
        return {
            "service": self._service,
            "consumer": self._consumer,
            "stream": stream,
            "assignment_id": assignment_id,
        }

    async def recover(
        self, assignment_id: str, *, owner: str = "", lost_at_ms: int | None = None
    ) -> RequeueOutcome:
        """Re-queue or dead-letter one pending assignment whose lock is gone.

        ``lost_at_ms`` is its lock's deadline if the caller knows it (the lease sweep);
        otherwise the entry's lease deadline is used, or now. The copy carries it, and
        the consumer that resumes the stream reports the recovery latency from it.

        One with too many fields to re-queue is dead-lettered as ``too_large``.

        Raises:
            RedisUnavailable: Redis could not be reached (nothing was changed, or the
                script ran atomically: either way retrying is safe).
        """
        fields = await self._gw.assignments.fetch_assignment(assignment_id)
        if fields is None:
            # Deleted: finished, or re-queued by someone else. Clear a stale PEL entry
            # and any lease left under this id.
            await self._gw.assignments.requeue(assignment_id, None)
            return self._count(RequeueOutcome.LOST_RACE)
        try:
            parsed: Assignment | InvalidAssignment = parse_assignment(
                assignment_id, fields, self._gw.keys
            )
        except InvalidAssignment as exc:
            parsed = exc
        lock_exists = False
        dead_lock: str | None = None  # a lock naming a dead session: removed after
        if isinstance(parsed, Assignment):
            lock_exists, dead_lock = await self._gw.liveness.lock_state(parsed.stream)
        decision = decide(
            parsed,
            lock_exists=lock_exists,
            max_retries=self._max_retries,
            raw_retry=_safe_retry(fields),
        )
        if decision.action is Action.SKIP_ALIVE:
            return self._count(RequeueOutcome.OWNER_ALIVE)
        if decision.action is Action.REQUEUE:
            if not owner:
                # For the log line: the consumer it is pending with is the one that is
                # gone (the sweep and the scan know only the assignment id).
                owner = await self._gw.assignments.pending_owner(assignment_id)
            try:
                new_id = await self._gw.assignments.requeue(
                    assignment_id,
                    decision.retry_count,
                    lost_at="lease" if lost_at_ms is None else lost_at_ms,
                )
            except EntryTooLarge as exc:
                # Refused before any write, so it is still pending: a copy cannot be
                # made, but a dead letter can (its fields carried as JSON).
                decision = Decision(
                    Action.DEAD_LETTER, DeadLetterReason.TOO_LARGE, decision.retry_count, str(exc)
                )
            else:
                if new_id is None:
                    return self._count(RequeueOutcome.LOST_RACE)
                assert isinstance(parsed, Assignment)
                await self._drop_dead_lock(parsed.stream, dead_lock)
                extra = self._extra(assignment_id, parsed.stream)
                log.info(
                    "re-queued assignment %s of stream %r as %s (retry %d of %d): its "
                    "owner %s is gone",
                    assignment_id,
                    parsed.stream,
                    new_id,
                    decision.retry_count,
                    self._max_retries,
                    repr(owner) if owner else "(unknown)",
                    extra=extra,
                )
                _tracing.mark("streamjobs.requeue", {**extra, "retry_count": decision.retry_count})
                return self._count(RequeueOutcome.REQUEUED)
        assert decision.reason is not None
        if not owner:
            owner = await self._gw.assignments.pending_owner(assignment_id)
        moved = await self.dead_letter(
            assignment_id,
            decision.reason,
            retry_count=decision.retry_count,
            owner=owner,
            error=decision.error,
        )
        if moved and isinstance(parsed, Assignment):
            await self._drop_dead_lock(parsed.stream, dead_lock)
        return self._count(RequeueOutcome.DEAD_LETTERED if moved else RequeueOutcome.LOST_RACE)

    async def _drop_dead_lock(self, stream: str, token: str | None) -> None:
        """Remove the lock a dead session left on ``stream`` (compare-and-delete on its
        token), once its assignment was re-queued or dead-lettered.

        Under ``Liveness.SESSION`` such a lock has a TTL of ten minutes or more: left in
        place it outlives the job (a dead-lettered poison stream kept it that long). A
        dead session never comes back, so the token read before the move is still dead;
        a lock another consumer took meanwhile holds another token and is left alone.
        A failure only leaves the lock to its TTL or the next acquirer, which replaces it.
        """
        if token is None:
            return
        try:
            await self._gw.completion.release(stream, token, -1)
        except Exception as exc:
            log.warning(
                "could not remove the dead session's lock of stream %r (%s): it expires "
                "by itself or is replaced by the next owner",
                stream,
                exc,
                extra=self._extra("", stream),
            )

    async def dead_letter_unparseable(
        self, assignment_id: str, fields: RawFields, error: InvalidAssignment, *, owner: str
    ) -> bool:
        """Dead-letter an assignment intake could not parse; False if it was not pending."""
        return await self.dead_letter(
            assignment_id,
            DeadLetterReason.UNPARSEABLE,
            retry_count=_safe_retry(fields),
            owner=owner,
            error=str(error),
        )

    async def dead_letter(
        self,
        assignment_id: str,
        reason: DeadLetterReason,
        *,
        retry_count: int,
        owner: str,
        error: str = "",
    ) -> bool:
        """Move a pending assignment to the dead-letter stream; False if it was not pending."""
        meta = assignment_meta(
            reason,
            retry_count=retry_count,
            assignment_stream=self._gw.keys.assignments,
            assignment_id=assignment_id,
            owner=owner,
            error=error,
        )
        moved = await self._gw.assignments.dead_letter_assignment(assignment_id, meta)
        if moved is None:
            return False
        extra = self._extra(assignment_id)
        log.warning(
            "dead-lettered assignment %s (%s, retry %d) as %s",
            assignment_id,
            reason.value,
            retry_count,
            moved[0],
            extra=extra,
        )
        _tracing.mark("streamjobs.dead_letter", {**extra, "reason": reason.value})
        self._metrics.dead_lettered(self._service, reason)
        if moved[1] > 0:
            self._metrics.dlq_trimmed(self._service, moved[1])
        return True

    @property
    def max_retries(self) -> int:
        return self._max_retries

    def _count(self, outcome: RequeueOutcome) -> RequeueOutcome:
        self._metrics.requeue(self._service, outcome)
        return outcome
