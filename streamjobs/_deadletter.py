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
_rejected      data entries whose handler raised ``DeadLetter``: the reason it gave
_job_info      data entries: the ``info`` of the job (assignment) it belonged to, JSON
_job           data entries: that job's identity, its first assignment id
============== ===================================================================

An assignment dead letter (reasons ``max_retries_exceeded``, ``unparseable``,
``too_large``) is moved atomically out of the assignment stream; a data-entry dead
letter (``handler_failed``) is appended before the entry is acked, so a crash in
between leaves a duplicate dead letter, never a lost entry.

An entry too large for a script to copy field by field (more than
``_redis._scripts.MAX_COPY_VALUES`` names and values in all), or one with a field named
``_fields_json`` itself, is dead-lettered with the metadata as fields and its
original fields in one field ``_fields_json``: a JSON array
``[name, value, name, value, ...]`` encoded by the script (cjson).
:func:`parse_dead_letter` reads either form into the same ``fields``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ._dlq_reason import DeadLetterReason
from ._wire import RETRY_FIELD

REASON_FIELD = "_dlq_reason"
SOURCE_STREAM_FIELD = "_source_stream"
SOURCE_ID_FIELD = "_source_id"
OWNER_FIELD = "_owner"
ERROR_FIELD = "_error"
ATTEMPTS_FIELD = "_attempts"
DEAD_AT_FIELD = "_dead_at_ms"
FIELDS_JSON_FIELD = "_fields_json"
REJECTED_FIELD = "_rejected"
JOB_INFO_FIELD = "_job_info"
JOB_FIELD = "_job"
GROUP_FIELD = "_group"
"""The shared group (``GroupConsumer``) a data entry was dead-lettered from: a replay
appends it to its stream again, for any member of the group."""
"""Carries the original fields of a dead letter too large to copy field by field.

Not a metadata field: an original field of this name is kept (the dead letter then
takes the JSON form, which holds it)."""
META_FIELDS = (
    REASON_FIELD,
    RETRY_FIELD,
    SOURCE_STREAM_FIELD,
    SOURCE_ID_FIELD,
    OWNER_FIELD,
    ERROR_FIELD,
    ATTEMPTS_FIELD,
    DEAD_AT_FIELD,
    REJECTED_FIELD,
    JOB_INFO_FIELD,
    JOB_FIELD,
    GROUP_FIELD,
)
"""Every metadata field; an original field of the same name is replaced."""

ERROR_MAX_CHARS = 1000

Pairs = list[tuple[str, str]]


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
    rejected: str | None = None,
    info: Mapping[str, Any] | None = None,
    job: str = "",
) -> Pairs:
    """Every field of a data entry's dead letter but ``_dead_at_ms`` (the script's).

    ``rejected``: the reason the handler gave with ``DeadLetter`` (then the reason is
    ``rejected``); None when it kept failing (``handler_failed``). ``info``: the job's
    ``info``, kept so that a replay that starts a new job gives it the same. ``job``:
    the job's identity (docs/design.md#job-identity), so that a replay never hands the
    entry to a later job of the same name.
    """
    out = [(k, v) for k, v in fields.items() if k not in META_FIELDS]
    out += _meta(
        DeadLetterReason.HANDLER_FAILED if rejected is None else DeadLetterReason.REJECTED,
        retry_count=retry_count,
        source_stream=stream,
        source_id=entry_id,
        owner=owner,
        error=error,
    )
    out.append((ATTEMPTS_FIELD, str(attempts)))
    if rejected is not None:
        out.append((REJECTED_FIELD, rejected[:ERROR_MAX_CHARS]))
    if info:
        out.append((JOB_INFO_FIELD, json.dumps(dict(info), separators=(",", ":"))))
    if job:
        out.append((JOB_FIELD, job))
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
        fields: the original entry's fields, without the metadata (read from
            ``_fields_json`` when the dead letter carries them there).
        rejected: the reason a handler gave with ``DeadLetter`` (reason
            ``rejected``); '' otherwise.
        info: a data entry's job ``info`` ({} if none, or unreadable).
        job: a data entry's job, its first assignment id ('' if unknown: written
            before dead letters carried it).
        group: for an entry a ``GroupConsumer`` dead-lettered, its consumer group ('' for
            any other dead letter).
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
    rejected: str = ""
    info: Mapping[str, Any] = field(default_factory=dict)
    job: str = ""
    group: str = ""

    @property
    def is_assignment(self) -> bool:
        """True for a dead assignment, False for a data entry."""
        return self.attempts is None


def _int_or_none(value: str | None) -> int | None:
    if value is None or not value.isascii() or not value.isdigit():
        return None
    return int(value)


def _carried(raw: str) -> dict[str, str] | None:
    """The fields in a ``_fields_json`` value; None if it is not that JSON form."""
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    if value == {}:  # cjson encodes an empty table as an object
        return {}
    if not isinstance(value, list) or len(value) % 2 or not all(isinstance(x, str) for x in value):
        return None
    return dict(zip(value[::2], value[1::2], strict=True))


def _original_fields(fields: Mapping[str, str]) -> dict[str, str]:
    # A dead assignment (no _attempts) keeps its _job: a replay run's, which its replay
    # must carry again (docs/design.md#job-identity); only data entries' is metadata.
    meta = META_FIELDS if ATTEMPTS_FIELD in fields else tuple(set(META_FIELDS) - {JOB_FIELD})
    own = {k: v for k, v in fields.items() if k not in meta}
    raw = own.get(FIELDS_JSON_FIELD)
    carried = None if raw is None else _carried(raw)
    if carried is None:
        return own  # the field-by-field form (a malformed carrier is an ordinary field)
    del own[FIELDS_JSON_FIELD]
    out = {k: v for k, v in carried.items() if k not in meta}
    out.update(own)
    return out


def parse_dead_letter(entry_id: str, fields: Mapping[str, str]) -> DeadLetterRecord:
    """Parse a dead-letter entry; never raises (missing metadata reads as unknown).

    Either form is read: original fields carried in ``_fields_json`` come back in
    ``fields`` like ones written field by field. A ``_fields_json`` value that is not
    a JSON array of an even number of strings is kept as an ordinary field.
    """
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
        fields=_original_fields(fields),
        rejected=fields.get(REJECTED_FIELD, ""),
        info=_job_info(fields.get(JOB_INFO_FIELD)),
        job=fields.get(JOB_FIELD, ""),
        group=fields.get(GROUP_FIELD, ""),
    )


def _job_info(raw: str | None) -> dict[str, Any]:
    if raw is None:
        return {}
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


def flatten(pairs: Sequence[tuple[str, str]]) -> list[str]:
    """``[(k, v), ...]`` as ``[k, v, ...]``, the shape script arguments take."""
    return [x for pair in pairs for x in pair]
