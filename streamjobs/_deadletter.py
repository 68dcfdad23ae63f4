"""The dead-letter format: field names, building both kinds, parsing one back.

A dead letter is an entry of the service's dead-letter stream (docs/design.md#wire-format).
It keeps the original entry's fields and adds metadata, all named here and nowhere
else (the Lua scripts receive the names they write as arguments):

============== ===================================================================
field          value
============== ===================================================================
_dlq_reason    a :class:`DeadLetterReason` value
_retry_count   re-queues after owner deaths (assignments), or the assignment's count
_source_stream the assignment stream, or the data stream the entry came from
_source_id     the entry's id in that stream
_owner         the consumer that last held it, when known
_error         exception type and message, truncated to ``ERROR_MAX_CHARS``
_attempts      data entries only: ``handle()`` calls made before giving up
_dead_at_ms    server time of the move, milliseconds (added by the script)
============== ===================================================================

An assignment dead letter (reasons ``max_retries_exceeded``, ``unparseable``) is
moved atomically out of the assignment stream; a data-entry dead letter
(``handler_failed``) is appended before the entry is acked, so a crash in between
leaves a duplicate dead letter, never a lost entry.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ._wire import RETRY_FIELD

REASON_FIELD = "_dlq_reason"
SOURCE_STREAM_FIELD = "_source_stream"
SOURCE_ID_FIELD = "_source_id"
OWNER_FIELD = "_owner"
ERROR_FIELD = "_error"
ATTEMPTS_FIELD = "_attempts"
DEAD_AT_FIELD = "_dead_at_ms"
META_FIELDS = (
    REASON_FIELD,
    RETRY_FIELD,
    SOURCE_STREAM_FIELD,
    SOURCE_ID_FIELD,
    OWNER_FIELD,
    ERROR_FIELD,
    ATTEMPTS_FIELD,
    DEAD_AT_FIELD,
)
"""Every metadata field; an original field of the same name is replaced."""

ERROR_MAX_CHARS = 1000

Pairs = list[tuple[str, str]]


class DeadLetterReason(enum.Enum):
    """``_dlq_reason`` of a dead-letter entry."""

    MAX_RETRIES_EXCEEDED = "max_retries_exceeded"
    """An assignment whose owners died ``max_retries`` times (a poison stream)."""
    UNPARSEABLE = "unparseable"
    """An assignment entry that cannot be parsed."""
    HANDLER_FAILED = "handler_failed"
    """A data entry whose handler kept failing, or raised ``DeadLetter``."""
    MANUAL = "manual"
    """Written by an operator."""


def describe_error(error: BaseException) -> str:
    """``Type: message`` of a handler's exception, as stored in ``_error``."""
    return f"{type(error).__name__}: {error}"


def _meta(
    reason: DeadLetterReason,
    *,
    retry_count: int,
    source_stream: str,
    source_id: str,
    owner: str,
    error: str,
) -> Pairs:
    meta = [
        (REASON_FIELD, reason.value),
        (RETRY_FIELD, str(retry_count)),
        (SOURCE_STREAM_FIELD, source_stream),
        (SOURCE_ID_FIELD, source_id),
    ]
    if owner:
        meta.append((OWNER_FIELD, owner))
    if error:
        meta.append((ERROR_FIELD, error[:ERROR_MAX_CHARS]))
    return meta


def assignment_meta(
    reason: DeadLetterReason,
    *,
    retry_count: int,
    assignment_stream: str,
    assignment_id: str,
    owner: str,
    error: str = "",
) -> Pairs:
    """Metadata of an assignment's dead letter; the script adds the original fields."""
    return _meta(
        reason,
        retry_count=retry_count,
        source_stream=assignment_stream,
        source_id=assignment_id,
        owner=owner,
        error=error,
    )


def entry_dead_letter(
    fields: Mapping[str, str],
    *,
    stream: str,
    entry_id: str,
    retry_count: int,
    attempts: int,
    owner: str,
    error: str,
) -> Pairs:
    """Every field of a data entry's dead letter but ``_dead_at_ms`` (the script's)."""
    out = [(k, v) for k, v in fields.items() if k not in META_FIELDS]
    out += _meta(
        DeadLetterReason.HANDLER_FAILED,
        retry_count=retry_count,
        source_stream=stream,
        source_id=entry_id,
        owner=owner,
        error=error,
    )
    out.append((ATTEMPTS_FIELD, str(attempts)))
    return out


@dataclass(frozen=True, slots=True)
class DeadLetterRecord:
    """One dead-letter entry, parsed.

    Attributes:
        id: the dead letter's id in the dead-letter stream.
        reason: why it was dead-lettered; None if ``_dlq_reason`` is missing or unknown.
        source_stream: the stream it came from ('' if unknown).
        source_id: its id there ('' if unknown).
        owner: the consumer that last held it ('' if unknown).
        error: the handler's error ('' if none).
        retry_count: ``_retry_count`` (0 if missing or malformed).
        attempts: handler attempts of a data entry; None for assignments.
        dead_at_ms: server time of the move; None if missing.
        fields: the original entry's fields, without the metadata.
    """

    id: str
    reason: DeadLetterReason | None
    source_stream: str
    source_id: str
    owner: str
    error: str
    retry_count: int
    attempts: int | None
    dead_at_ms: int | None
    fields: Mapping[str, str]

    @property
    def is_assignment(self) -> bool:
        """True for a dead assignment, False for a data entry."""
        return self.attempts is None


def _int_or_none(value: str | None) -> int | None:
    if value is None or not value.isascii() or not value.isdigit():
        return None
    return int(value)


def parse_dead_letter(entry_id: str, fields: Mapping[str, str]) -> DeadLetterRecord:
    """Parse a dead-letter entry; never raises (missing metadata reads as unknown)."""
    try:
        reason: DeadLetterReason | None = DeadLetterReason(fields.get(REASON_FIELD, ""))
    except ValueError:
        reason = None
    return DeadLetterRecord(
        id=entry_id,
        reason=reason,
        source_stream=fields.get(SOURCE_STREAM_FIELD, ""),
        source_id=fields.get(SOURCE_ID_FIELD, ""),
        owner=fields.get(OWNER_FIELD, ""),
        error=fields.get(ERROR_FIELD, ""),
        retry_count=_int_or_none(fields.get(RETRY_FIELD)) or 0,
        attempts=_int_or_none(fields.get(ATTEMPTS_FIELD)),
        dead_at_ms=_int_or_none(fields.get(DEAD_AT_FIELD)),
        fields={k: v for k, v in fields.items() if k not in META_FIELDS},
    )


def flatten(pairs: Sequence[tuple[str, str]]) -> list[str]:
    """``[(k, v), ...]`` as ``[k, v, ...]``, the shape script arguments take."""
    return [x for pair in pairs for x in pair]
