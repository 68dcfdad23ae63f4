"""The wire format of assignment entries and data-stream markers (docs/design.md#wire-format).

An assignment has fields ``stream``, ``info`` (JSON object), ``_retry_count``
(decimal, absent = 0) and any extra fields, which re-queues carry verbatim. The Go
library's single ``lbs-input`` field holding ``{"DataStreamName": ..., "Info": ...}``
is accepted too. A producer ends a data stream with an entry whose ``_eos`` field is
``1``; it is never handed to ``handle()``.

Parsing is pure. Dead-letter entries have a module of their own (``_deadletter``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ._keys import Keys, check_stream_name
from .exceptions import InvalidAssignment, InvalidStreamName

STREAM_FIELD = "stream"
INFO_FIELD = "info"
RETRY_FIELD = "_retry_count"
FIRST_ID_FIELD = "_first_id"
JOB_FIELD = "_job"
"""Written by re-queues: the id of the job's first submission."""
LOST_AT_FIELD = "_lost_at"
"""Written by recovery re-queues: when the previous owner was lost (server ms)."""
GO_FIELD = "lbs-input"
EOS_FIELD = "_eos"
EOS_VALUE = "1"
CANCEL_FIELD = "_cancel"
"""On an end marker written by ``Producer.cancel_stream``: the reason (the stream was
cancelled, not finished)."""
REPLAYED_FROM_FIELD = "_replayed_from"
"""Data entries put back by a DLQ replay: the id the entry had when it was first
dead-lettered (kept across repeated replays), for handlers to key idempotency on
(``Message.replayed_from``)."""
REPLAY_END_FIELD = "_replay_end"
"""Set (``1``) on the end marker a DLQ replay writes for its run (``replay_entry.lua``):
a run ends only there. Any other entry a run reads that is not a replayed copy was
appended to an ended job after its end, and is skipped (docs/design.md#job-identity)."""
QUOTE_MAX_CHARS = 200
"""Most characters of an input value an error message quotes: log lines stay short."""
MESSAGE_MAX_CHARS = 500
"""Most characters of any other text (a parser's own error) an error message carries."""


@dataclass(frozen=True, slots=True)
class Assignment:
    """A parsed assignment entry."""

    id: str
    stream: str
    info: Mapping[str, Any]
    retry_count: int
    first_id: str = ""
    """Id of the job's first submission (this entry's own id unless re-queued)."""
    lost_at_ms: int | None = None
    """When recovery found the previous owner lost (server ms); None unless recovered."""
    job: str = ""
    """The job whose entries it hands over: ``_job`` (set on an assignment a DLQ replay
    queues: the job its entries came from), else :attr:`first_id`. Dead letters record
    it, and a replay never puts an entry into an assignment of another job."""
    run: bool = False
    """A DLQ replay's run (it carries ``_job``): it hands over only replayed copies,
    and ends only at its replay's end marker (:data:`REPLAY_END_FIELD`)."""


def quote(value: str | bytes, limit: int = QUOTE_MAX_CHARS) -> str:
    """``repr(value)``, or the ``repr`` of its first ``limit`` characters followed by
    ``…(N bytes)``, N being the whole value's size."""
    if len(value) <= limit:
        return repr(value)
    return f"{value[:limit]!r}…({_size(value)} bytes)"


def clip(text: str, limit: int = MESSAGE_MAX_CHARS) -> str:
    """``text``, or its first ``limit`` characters followed by ``…(N bytes)``."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}…({_size(text)} bytes)"


def _size(value: str | bytes) -> int:
    return len(value) if isinstance(value, bytes) else len(value.encode("utf-8", "surrogatepass"))


def _text(value: bytes | str, what: str) -> str:
    if isinstance(value, str):
        return value
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidAssignment(f"{what} is not valid UTF-8") from None


def parse_retry_count(fields: Mapping[str, bytes | str]) -> int:
    """``_retry_count`` of raw fields; absent = 0.

    Raises:
        InvalidAssignment: present but not a non-negative decimal.
    """
    raw = fields.get(RETRY_FIELD)
    if raw is None:
        return 0
    text = _text(raw, RETRY_FIELD)
    if not text.isascii() or not text.isdigit() or len(text) > 18:
        raise InvalidAssignment(f"{RETRY_FIELD} must be a non-negative decimal, got {quote(text)}")
    return int(text)


def _info(raw: str, what: str) -> dict[str, Any]:
    try:
        info = json.loads(raw)
    except ValueError as exc:
        raise InvalidAssignment(f"{what} is not valid JSON: {clip(str(exc))}") from None
    if not isinstance(info, dict):
        raise InvalidAssignment(f"{what} must be a JSON object, got {type(info).__name__}")
    return info


def parse_assignment(
    entry_id: str, fields: Mapping[str, bytes | str], keys: Keys | None = None
) -> Assignment:
    """Parse one assignment entry's fields (names already decoded).

    Args:
        entry_id: the entry's id.
        fields: its fields.
        keys: the service's keys; a stream named like one of them is refused.

    Raises:
        InvalidAssignment: why the entry cannot be processed. Nothing else: any failure
            of the parser (a RecursionError from deeply nested JSON, say) is one, since
            one bad entry must never stop a reader.
    """
    try:
        return _parse(entry_id, fields, keys)
    except InvalidAssignment:
        raise
    except Exception as exc:
        why = clip(f"{type(exc).__name__}: {exc}")
        raise InvalidAssignment(f"cannot be parsed ({why})") from None


def _parse(entry_id: str, fields: Mapping[str, bytes | str], keys: Keys | None) -> Assignment:
    retry_count = parse_retry_count(fields)
    if STREAM_FIELD in fields:
        stream = _text(fields[STREAM_FIELD], STREAM_FIELD)
        raw_info = fields.get(INFO_FIELD)
        info = {} if raw_info is None else _info(_text(raw_info, INFO_FIELD), INFO_FIELD)
    elif GO_FIELD in fields:
        doc = _info(_text(fields[GO_FIELD], GO_FIELD), GO_FIELD)
        lowered = {str(k).lower(): v for k, v in doc.items()}
        go_stream = lowered.get("datastreamname")  # Go's decoder ignores case in names
        if not isinstance(go_stream, str):
            raise InvalidAssignment(f"{GO_FIELD} has no string DataStreamName")
        stream = go_stream
        go_info = lowered.get("info")
        if go_info is None:
            go_info = {}
        if not isinstance(go_info, dict):
            raise InvalidAssignment(f"{GO_FIELD} Info must be an object")
        info = go_info
    else:
        raise InvalidAssignment(f"missing field {STREAM_FIELD!r}")
    try:
        if keys is None:
            check_stream_name(stream)
        else:
            keys.check_data_stream(stream)
    except InvalidStreamName as exc:
        raise InvalidAssignment(
            f"invalid stream name {quote(stream)}: {clip(exc.reason)}"
        ) from None
    raw_first = fields.get(FIRST_ID_FIELD)
    first_id = entry_id if raw_first is None else _text(raw_first, FIRST_ID_FIELD)
    raw_job = fields.get(JOB_FIELD)
    return Assignment(
        id=entry_id,
        stream=stream,
        info=info,
        retry_count=retry_count,
        first_id=first_id,
        lost_at_ms=_lost_at(fields.get(LOST_AT_FIELD)),
        job=first_id if raw_job is None else _text(raw_job, JOB_FIELD),
        run=raw_job is not None,
    )


def _lost_at(raw: bytes | str | None) -> int | None:
    """``_lost_at`` as ms, None if absent or unreadable: it only feeds a metric, so a
    bad value never makes the assignment unusable."""
    if raw is None:
        return None
    value = raw.decode("ascii", "replace") if isinstance(raw, bytes) else raw
    return int(value) if value.isascii() and value.isdigit() and len(value) <= 18 else None


def stream_name_of(fields: Mapping[str, str]) -> str:
    """The data stream an assignment's fields name, in either form ('' if none): for
    showing and indexing an entry that may not parse."""
    if STREAM_FIELD in fields:
        return fields[STREAM_FIELD]
    try:
        doc = json.loads(fields.get(GO_FIELD, "null"))
        name = {str(k).lower(): v for k, v in doc.items()}.get("datastreamname")
    except (ValueError, AttributeError, RecursionError):
        return ""
    return name if isinstance(name, str) else ""


def build_fields(stream: str, info: Mapping[str, Any] | None) -> dict[str, str]:
    """Fields of a new assignment entry.

    Raises:
        InvalidStreamName: the name cannot be given a co-located lock key.
        TypeError: ``info`` is not JSON-serialisable.
    """
    check_stream_name(stream)
    return {
        STREAM_FIELD: stream,
        INFO_FIELD: json.dumps(dict(info or {}), separators=(",", ":")),
    }


def is_eos(fields: Mapping[str, str]) -> bool:
    """True for the end-of-stream marker entry."""
    return fields.get(EOS_FIELD) == EOS_VALUE
