"""What a dead-letter replay (:mod:`streamjobs.dlq`) works with, without I/O: its limits,
how dead data entries are cut into script calls and the fields they are appended with,
the job queued for a data stream as the replay sees it, and why it skips one."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ._deadletter import DeadLetterRecord
from ._keys import Keys
from ._redis._scripts import MAX_COPY_VALUES
from ._wire import REPLAYED_FROM_FIELD

REPLAY_MARKER_TTL_MS = 86_400_000
"""How long a data entry's replay remembers the id it appended (one day)."""
REPLAY_BATCH = 100
"""The most dead letters of one data stream one script call puts back."""
REPLAY_BATCH_VALUES = 4 * MAX_COPY_VALUES
"""The most field names and values one such call carries (one entry may have
``MAX_COPY_VALUES``)."""


class _CannotReplay(Exception):
    pass


class _Busy(Exception):
    pass


@dataclass(frozen=True, slots=True)
class _Queued:
    """The job queued for a data stream: its identity, and whether it is a replay run
    (an assignment carrying ``_job``, queued by a replay)."""

    job: str
    run: bool


_ID = re.compile(r"[0-9]+-[0-9]+")


def _replay_fields(record: DeadLetterRecord) -> list[tuple[str, str]]:
    """A dead data entry's fields as a replay appends them: with ``_replayed_from``, the
    id it had when first dead-lettered (a replayed entry dead-lettered again keeps it)."""
    fields = dict(record.fields)
    fields[REPLAYED_FROM_FIELD] = fields.get(REPLAYED_FROM_FIELD) or record.source_id
    return list(fields.items())


def _batches(
    records: list[DeadLetterRecord],
) -> list[list[DeadLetterRecord]]:
    """``records`` in order, cut into script calls of at most :data:`REPLAY_BATCH`
    dead letters and :data:`REPLAY_BATCH_VALUES` values, and where their job changes (a
    batch a new job is queued for is that job's)."""
    out: list[list[DeadLetterRecord]] = []
    values = 0
    for record in records:
        size = 2 * len(record.fields) + 2  # + _replayed_from
        if (
            not out
            or len(out[-1]) >= REPLAY_BATCH
            or values + size > REPLAY_BATCH_VALUES
            or out[-1][-1].job != record.job
        ):
            out.append([])
            values = 0
        out[-1].append(record)
        values += size
    return out


def _check_entry(record: DeadLetterRecord, keys: Keys) -> str:
    """The data stream a dead data entry goes back to.

    Raises:
        InvalidStreamName, _CannotReplay: it cannot be put back.
    """
    stream = record.source_stream
    if not stream:
        raise _CannotReplay("it names no source stream")
    keys.check_data_stream(stream)
    if not record.fields:
        raise _CannotReplay("it carries no fields")
    if 2 * len(record.fields) + 2 > MAX_COPY_VALUES:  # + _replayed_from
        raise _CannotReplay(f"{len(record.fields)} fields: too many for one script call")
    return stream
