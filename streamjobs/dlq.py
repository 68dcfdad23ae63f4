"""Dead letters in Python: list, get, replay and purge (docs/operations.md#dead-letters).

``streamjobs dlq list|show|replay|purge`` is built on :class:`DeadLetters`.

Replay puts a dead letter back where it came from and removes it, never the other
way round:

* a dead **assignment** goes back on the assignment stream with ``_retry_count``
  reset (and without ``_lost_at``); the add and the removal are one script, since
  both streams carry the service's hash tag;
* dead **data entries** are appended again to their data stream, in dead-letter order
  (at the tail: entries written since come before them), all of one stream's in one
  script call in the stream's slot (:file:`lua/replay_entry.lua`), which records for
  a day which id each got, so a repeat (a second operator, or a retry after a crash
  before the dead letter was removed) appends nothing. Then the dead letters are
  removed. They always go before the end of the job that will read them, which is
  always the job they came from (docs/design.md#job-identity):

  - that job has finished (no job queued, no lock): a run of it is queued FIRST (an
    assignment carrying ``_job``), then they are placed with one end marker after
    them; a job of the name queued by ``add_stream`` in between is seen, and the
    replay is refused for that stream;
  - another job of the name is queued or running: refused for that stream, their
    dead letters kept, to replay once it has ended;
  - its newest entry is an end marker nobody has read yet (an earlier replay's, or a
    producer's whose job has not got there): they go before it (the unread marker is
    moved behind them), and the job queued or running for it hands them over;
  - a job is running or queued and the stream is open: at the tail, as any entry;
  - the job has read its end marker but not finished yet (or is being cancelled):
    the replay waits for it (up to :data:`BUSY_WAIT_S`), else skips them, their dead
    letters kept, to replay again (a run it queued is removed again).

So a replay can be repeated safely, and a crash halfway leaves the dead letter in
place, never lost.
"""

from __future__ import annotations

import builtins
import math
import time
from collections.abc import Sequence

import anyio

from ._deadletter import DeadLetterRecord, parse_dead_letter
from ._dlq_reason import DeadLetterReason
from ._dlq_replay import (
    _ID,
    REPLAY_MARKER_TTL_MS,
    _batches,
    _Busy,
    _CannotReplay,
    _check_entry,
    _replay_fields,
)
from ._dlq_replay import _Queued as _Queued  # tests import it from here
from ._dlq_types import DeadLetterFilter, Progress, Replayed, ReplayReport, _check_id
from ._redis._scripts import MAX_COPY_VALUES
from ._service_tool import ServiceTool
from ._wire import (
    EOS_FIELD,
    EOS_VALUE,
    FIRST_ID_FIELD,
    JOB_FIELD,
    LOST_AT_FIELD,
    REPLAY_END_FIELD,
    RETRY_FIELD,
    build_fields,
    parse_assignment,
    stream_name_of,
)
from .exceptions import InvalidAssignment, InvalidStreamName

__all__ = [
    "BUSY_WAIT_S",
    "DeadLetterFilter",
    "DeadLetters",
    "Progress",
    "ReplayReport",
    "Replayed",
]

PAGE = 500
BUSY_WAIT_S = 5.0
"""How long a replay waits for a data stream whose job has read its end marker (or is
being cancelled) to finish before skipping that stream's dead letters."""


class DeadLetters(ServiceTool):
    """The dead letters of one service.

    Args:
        redis: a ``redis.asyncio.Redis`` or ``RedisCluster`` (not closed here); a
            replay writes through it, so its user needs the consumers' permissions.
        service: the service whose dead letters these are.
        key_prefix: the consumers' ``ConsumerConfig.key_prefix``.
        dlq_stream: the consumers' ``RecoveryConfig.dlq_stream``, if they set one.
    """

    @property
    def stream(self) -> str:
        """The dead-letter stream's key."""
        return self._gw.dlq

    async def length(self) -> int:
        return await self._gw.operator.dlq_length()

    async def list(
        self,
        *,
        reason: DeadLetterReason | str | None = None,
        source_stream: str | None = None,
        older_than_s: float | None = None,
        newer_than_s: float | None = None,
        limit: int | None = None,
    ) -> builtins.list[DeadLetterRecord]:
        """Dead letters matching every condition given, oldest first.

        Raises:
            ConfigurationError: a bad filter value, naming it.
        """
        return await self.select(
            DeadLetterFilter(reason, source_stream, older_than_s, newer_than_s, limit)
        )

    async def get(self, dead_letter_id: str) -> DeadLetterRecord | None:
        """One dead letter by id; None if there is none."""
        _check_id(dead_letter_id)
        page = await self._gw.operator.dlq_page(dead_letter_id, dead_letter_id, 1)
        return parse_dead_letter(*page[0]) if page else None

    async def select(self, selection: DeadLetterFilter) -> builtins.list[DeadLetterRecord]:
        """Dead letters matching ``selection``, oldest first (what :meth:`list` does)."""
        now_ms = await self._gw.assignments.server_time_ms()
        start, end = "-", "+"
        if selection.newer_than_s is not None:
            start = str(max(0, now_ms - math.ceil(selection.newer_than_s * 1000)))
        if selection.older_than_s is not None:
            end = str(max(0, now_ms - math.ceil(selection.older_than_s * 1000)))
        out: builtins.list[DeadLetterRecord] = []
        limit: float = selection.limit or math.inf
        while len(out) < limit:
            page = await self._gw.operator.dlq_page(start, end, PAGE)
            for entry_id, fields in page:
                record = parse_dead_letter(entry_id, fields)
                if selection.matches(record):
                    out.append(record)
                    if len(out) >= limit:
                        break
            if len(page) < PAGE:
                break
            start = f"({page[-1][0]}"
        return out

    async def _resolve(
        self, ids_or_filter: Sequence[str] | DeadLetterFilter
    ) -> tuple[builtins.list[DeadLetterRecord], builtins.list[tuple[str, str]]]:
        if isinstance(ids_or_filter, DeadLetterFilter):
            return await self.select(ids_or_filter), []
        if isinstance(ids_or_filter, str):
            ids_or_filter = [ids_or_filter]
        found, missing = [], []
        for dead_letter_id in ids_or_filter:
            record = await self.get(dead_letter_id)
            if record is None:
                missing.append((dead_letter_id, "no such dead letter (replayed or purged?)"))
            else:
                found.append(record)
        return found, missing

    async def replay(
        self,
        ids_or_filter: Sequence[str] | DeadLetterFilter,
        *,
        dry_run: bool = False,
        progress: Progress | None = None,
    ) -> ReplayReport:
        """Put dead letters back and remove them (see the module's docstring).

        Dead data entries of one stream are put back together, in dead-letter order,
        when the first of them comes; dead assignments one by one.

        Args:
            ids_or_filter: dead-letter ids, or a :class:`DeadLetterFilter`.
            dry_run: only say what would be replayed (``new_id`` is '').
            progress: called with (done, total) as it goes.

        Raises:
            ConfigurationError: a bad filter value, naming it.
        """
        records, skipped = await self._resolve(ids_or_filter)
        outcome: dict[str, Replayed | str] = {}
        streams: dict[str, builtins.list[DeadLetterRecord]] = {}
        for record in records:
            if record.is_assignment:
                continue
            try:
                stream = _check_entry(record, self._keys)
            except (InvalidStreamName, _CannotReplay) as exc:
                outcome[record.id] = str(exc)
            else:
                if not record.group:
                    streams.setdefault(stream, []).append(record)
        done = 0
        for record in records:
            if record.id in outcome:
                pass
            elif record.is_assignment:
                try:
                    result = await self._replay_assignment(record, dry_run)
                except (InvalidAssignment, InvalidStreamName, _CannotReplay) as exc:
                    outcome[record.id] = str(exc)
                else:
                    outcome[record.id] = result or "already replayed or purged"
            elif record.group:
                outcome[record.id] = await self._replay_group_entry(record, dry_run)
            else:
                stream = record.source_stream
                outcome.update(await self._replay_entries(stream, streams.pop(stream), dry_run))
            if progress is not None and len(outcome) > done:
                done = len(outcome)
                progress(done, len(records))
        report = ReplayReport(skipped=skipped, dry_run=dry_run)
        for record in records:
            done_or_why = outcome[record.id]
            if isinstance(done_or_why, Replayed):
                report.replayed.append(done_or_why)
            else:
                report.skipped.append((record.id, done_or_why))
        return report

    async def _replay_assignment(self, record: DeadLetterRecord, dry_run: bool) -> Replayed | None:
        gw, keys = self._gw, self._keys
        fields = dict(record.fields)
        fields.pop(RETRY_FIELD, None)
        fields.pop(LOST_AT_FIELD, None)
        try:
            stream = parse_assignment(record.id, fields, keys).stream
        except InvalidAssignment:
            stream = stream_name_of(fields)  # unparseable: back as it was, unindexed
        if 2 * len(fields) > MAX_COPY_VALUES:
            raise _CannotReplay(f"{len(fields)} fields: too many for one script call")
        if dry_run:
            return Replayed(record.id, "", keys.assignments)
        new_id = await gw.operator.replay_assignment(record.id, stream, list(fields.items()))
        if new_id is None:
            return None
        if stream:
            job = fields.get(FIRST_ID_FIELD) or new_id
            await gw.writes.start_job(stream, job if isinstance(job, str) else new_id, created=True)
        return Replayed(record.id, new_id, keys.assignments)

    async def _replay_group_entry(self, record: DeadLetterRecord, dry_run: bool) -> Replayed:
        """Append a shared group's dead entry to its stream again (no job, no order to
        keep: any member of the group reads it), then remove the dead letter."""
        stream = record.source_stream
        if dry_run:
            return Replayed(record.id, "", stream)
        new_id = await self._gw.operator.replay_group_entry(
            stream, record.id, _replay_fields(record), REPLAY_MARKER_TTL_MS
        )
        await self._gw.operator.delete_dead_letters([record.id])
        return Replayed(record.id, new_id, stream)

    async def _replay_entries(
        self, stream: str, records: builtins.list[DeadLetterRecord], dry_run: bool
    ) -> dict[str, Replayed | str]:
        """Put dead data entries of ``stream`` back, in order, batch by batch; each
        batch's dead letters are removed once it is in place. A batch that cannot be
        placed now (see :meth:`_place`) and the ones after it are skipped."""
        if dry_run:
            unfinished = await self._job_queued(stream) or await self._gw.liveness.lock_exists(
                stream
            )
            return {r.id: Replayed(r.id, "", stream, reassigned=not unfinished) for r in records}
        out: dict[str, Replayed | str] = {}
        reassigned = False
        for batch in _batches(records):
            try:
                ids, created = await self._place(stream, batch, records[0].id)
            except _Busy as exc:
                out.update({r.id: str(exc) for r in records if r.id not in out})
                break
            await self._gw.operator.delete_dead_letters([r.id for r in batch])
            reassigned = reassigned or created
            for record, new_id in zip(batch, ids, strict=True):
                out[record.id] = Replayed(record.id, new_id, stream, reassigned=reassigned)
        return out

    async def _place(
        self, stream: str, batch: builtins.list[DeadLetterRecord], unrecorded: str
    ) -> tuple[builtins.list[str], bool]:
        """Put one batch of ``stream``'s dead entries back where a job hands them to
        ``handle()``: (their ids in the stream, whether a new job was queued for them).

        A job for them is queued FIRST (docs/design.md#job-identity): the job they
        came from if it is still queued or running, else a *replay run* of it
        (:meth:`_queue_run`). Only then does ``replay_entry.lua`` place them, before
        that job's end: a job of the name that ``add_stream`` queued in between is seen
        (the run is not created) and the batch is refused, so no other job reads them.
        Entries dead-lettered before jobs were recorded (no ``_job``) join any job
        queued for the stream, else a run named ``unrecorded`` (a dead letter's id).

        Raises:
            _Busy: a later job of the name is queued or running, or the stream's job
                stayed past its end marker for :data:`BUSY_WAIT_S`.
        """
        gw = self._gw
        letters = [(r.id, _replay_fields(r)) for r in batch]
        recorded = next((r.job for r in batch if r.job), "")
        job = recorded or unrecorded
        deadline = time.monotonic() + BUSY_WAIT_S
        delay = 0.02
        created = False
        while True:
            queued = await self._queued_job(stream)
            if queued is None and not await gw.liveness.lock_exists(stream):
                # Finished, and its last owner is gone: a run of their job.
                queued, new = await self._queue_run(stream, batch, job)
                created = created or new
            if queued is not None:
                if (recorded or queued.run) and queued.job != job:
                    # A later job of the name would hand them to handle() as its own.
                    raise _Busy(
                        f"a later job of its stream {stream!r} is queued or running (job "
                        f"{queued.job}): replay it once that job has ended"
                    )
                put = await gw.operator.replay_entries(
                    stream, letters, run=queued.run, marker_ttl_ms=REPLAY_MARKER_TTL_MS
                )
                if put.state == "delivered" or (put.state == "placed" and queued.run):
                    return put.ids, created
                if put.state == "placed" and (put.closed or put.owned):
                    return put.ids, created  # the job reads on to them
                if put.state == "placed":
                    # At an open tail, no owner: the job queued when we looked reads
                    # them, unless it ended meanwhile (then: a run, next time round).
                    if await self._queued_job(stream) == queued:
                        return put.ids, created
                    continue
            # Busy: its job read its end marker (or is being cancelled) and has not
            # finished, or the previous job holds the lock still.
            if time.monotonic() + delay > deadline:
                if created:
                    await self._drop_run(stream, job)
                raise _Busy(
                    f"its stream {stream!r} is ending (its job read its end marker or is "
                    "being cancelled, and has not finished): replay it again later"
                )
            await anyio.sleep(delay)
            delay = min(2 * delay, 0.5)

    async def _queue_run(
        self, stream: str, batch: builtins.list[DeadLetterRecord], job: str
    ) -> tuple[_Queued | None, bool]:
        """Queue a replay run for ``batch``: an assignment of ``stream`` that carries
        their ``job`` (``_job``) and the info of the job they belonged to. Returns the job
        then queued for ``stream`` (the run, or one ``add_stream`` queued first) and
        whether the run was queued now.

        What the ended job left unread is skipped first, as ``add_stream`` does."""
        gw = self._gw
        info = next((r.info for r in batch if r.info), {})
        await gw.writes.start_job(stream, "", created=False)
        fields = {**build_fields(stream, info), JOB_FIELD: job}
        run_id, created = await gw.writes.add_assignment(stream, fields)
        if not created:
            return await self._queued_job(stream), False
        # (Its end is recorded under the run's own id, as for any job; its entries'
        # dead letters record ``job``.)
        await gw.writes.start_job(stream, run_id, created=True)
        return _Queued(job, run=True), True

    async def _drop_run(self, stream: str, job: str) -> None:
        """Undo :meth:`_queue_run` for a batch given up: remove the run if it is still
        queued, else (an owner took it) end it with an end marker, so that it does not
        wait for entries that will not come."""
        state, _, _ = await self._gw.writes.cancel_queued(stream)
        if state == "delivered" and await self._queued_job(stream) == _Queued(job, run=True):
            # Its own end marker: a run ends at no other (docs/design.md#job-identity).
            await self._gw.writes.append(stream, {EOS_FIELD: EOS_VALUE, REPLAY_END_FIELD: "1"})

    async def _job_queued(self, stream: str) -> bool:
        """Whether the active-assignment index names an assignment of ``stream`` that
        still exists (what ``add_stream`` would deduplicate to)."""
        return await self._queued_job(stream) is not None

    async def _queued_job(self, stream: str) -> _Queued | None:
        """The job (docs/design.md#job-identity) of the assignment of ``stream`` the
        active-assignment index names, if it still exists."""
        active = await self._gw.operator.active_id(stream)
        if active is None or not _ID.fullmatch(active):
            return None
        fields = (await self._gw.operator.assignment_fields([active]))[0]
        if fields is None:
            return None
        run = fields.get(JOB_FIELD)
        return _Queued(run or fields.get(FIRST_ID_FIELD) or active, run=bool(run))

    async def purge(
        self,
        ids_or_filter: Sequence[str] | DeadLetterFilter,
        *,
        dry_run: bool = False,
        progress: Progress | None = None,
    ) -> builtins.list[str]:
        """Delete dead letters for good; returns the ids deleted (or, with ``dry_run``,
        that would be).

        Raises:
            ConfigurationError: a bad filter value, naming it.
        """
        records, _ = await self._resolve(ids_or_filter)
        ids = [r.id for r in records]
        if dry_run:
            return ids
        deleted: builtins.list[str] = []
        for start in range(0, len(ids), PAGE):
            chunk = ids[start : start + PAGE]
            await self._gw.operator.delete_dead_letters(chunk)
            deleted += chunk
            if progress is not None:
                progress(len(deleted), len(ids))
        return deleted
