"""Dead letters in Python: list, get, replay and purge (docs/operations.md#dead-letters).

``streamjobs dlq list|show|replay|purge`` is built on :class:`DeadLetters`.

Replay puts a dead letter back where it came from and removes it, never the other
way round:

* a dead **assignment** goes back on the assignment stream with ``_retry_count``
  reset (and without ``_lost_at``); the add and the removal are one script, since
  both streams carry the service's hash tag;
* a dead **data entry** is appended again to its data stream (at the tail: entries
  written since come before it). A script in the stream's slot appends it and
  records, for a day, which id it got, so a repeat (a second operator, or a retry
  after a crash before the dead letter was removed) appends nothing. Then the dead
  letter is removed. If the stream had finished, an end marker follows the entry and
  the stream gets a new assignment, so a consumer handles it.

So a replay can be repeated safely, and a crash halfway leaves the dead letter in
place, never lost.
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ._deadletter import DeadLetterReason, DeadLetterRecord, parse_dead_letter
from ._keys import DEFAULT_PREFIX, Keys
from ._operator import OperatorGateway
from ._scripts import MAX_COPY_VALUES
from ._wire import LOST_AT_FIELD, RETRY_FIELD, build_fields, parse_assignment, stream_name_of
from .exceptions import ConfigurationError, InvalidAssignment, InvalidStreamName

REPLAY_MARKER_TTL_MS = 86_400_000
"""How long a data entry's replay remembers the id it appended (one day)."""
PAGE = 500

Progress = Callable[[int, int], None]
"""Called with (done, total) as a replay or purge goes."""


@dataclass(frozen=True, slots=True)
class DeadLetterFilter:
    """Which dead letters: every condition given must hold.

    Attributes:
        reason: a :class:`DeadLetterReason` (or its value).
        source_stream: the stream it came from (the assignment stream for assignments).
        older_than_s: dead-lettered at least this long ago.
        newer_than_s: dead-lettered at most this long ago.
        limit: at most this many (the oldest first).

    Raises:
        ConfigurationError: a bad value, naming the field.
    """

    reason: DeadLetterReason | str | None = None
    source_stream: str | None = None
    older_than_s: float | None = None
    newer_than_s: float | None = None
    limit: int | None = None

    def __post_init__(self) -> None:
        if self.reason is not None and not isinstance(self.reason, DeadLetterReason):
            try:
                object.__setattr__(self, "reason", DeadLetterReason(self.reason))
            except ValueError:
                known = ", ".join(r.value for r in DeadLetterReason)
                raise ConfigurationError(
                    "reason", f"{self.reason!r} is not one of {known}"
                ) from None
        for name in ("older_than_s", "newer_than_s"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or value < 0
            ):
                raise ConfigurationError(name, f"must be a number of seconds >= 0, got {value!r}")
        if self.limit is not None and (
            isinstance(self.limit, bool) or not isinstance(self.limit, int) or self.limit < 1
        ):
            raise ConfigurationError("limit", f"must be an int >= 1, got {self.limit!r}")

    def matches(self, record: DeadLetterRecord) -> bool:
        if self.reason is not None and record.reason is not self.reason:
            return False
        return self.source_stream is None or record.source_stream == self.source_stream


@dataclass(frozen=True, slots=True)
class Replayed:
    dead_letter_id: str
    new_id: str
    """The id of the re-added assignment, or of the re-appended data entry."""
    target: str
    """Where it went: the assignment stream, or the data stream."""
    reassigned: bool = False
    """A data entry whose stream had finished: its stream got a new assignment."""


@dataclass(frozen=True, slots=True)
class ReplayReport:
    replayed: list[Replayed] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    """(dead letter id, why): gone already, or it cannot be put back."""
    dry_run: bool = False


class DeadLetters:
    """The dead letters of one service.

    Args:
        redis: a ``redis.asyncio.Redis`` or ``RedisCluster`` (not closed here).
        service: the service.
        key_prefix: the consumers' ``ConsumerConfig.key_prefix``.
        dlq_stream: the consumers' ``RecoveryConfig.dlq_stream``, if they set one.
    """

    def __init__(
        self,
        redis: Any,
        *,
        service: str,
        key_prefix: str = DEFAULT_PREFIX,
        dlq_stream: str | None = None,
    ) -> None:
        keys = Keys(service, key_prefix)
        if dlq_stream is not None:
            keys.check_dlq_name(dlq_stream)
        self._keys = keys
        self._gw = OperatorGateway(redis, keys, dlq=dlq_stream)

    @property
    def stream(self) -> str:
        """The dead-letter stream's key."""
        return self._gw.dlq

    async def length(self) -> int:
        return await self._gw.dlq_length()

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
        page = await self._gw.dlq_page(dead_letter_id, dead_letter_id, 1)
        return parse_dead_letter(*page[0]) if page else None

    async def select(self, selection: DeadLetterFilter) -> builtins.list[DeadLetterRecord]:
        """Dead letters matching ``selection``, oldest first (what :meth:`list` does)."""
        now_ms = await self._gw.server_time_ms()
        start, end = "-", "+"
        if selection.newer_than_s is not None:
            start = str(max(0, now_ms - math.ceil(selection.newer_than_s * 1000)))
        if selection.older_than_s is not None:
            end = str(max(0, now_ms - math.ceil(selection.older_than_s * 1000)))
        out: builtins.list[DeadLetterRecord] = []
        limit: float = selection.limit or math.inf
        while len(out) < limit:
            page = await self._gw.dlq_page(start, end, PAGE)
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

        Args:
            ids_or_filter: dead-letter ids, or a :class:`DeadLetterFilter`.
            dry_run: only say what would be replayed (``new_id`` is '').
            progress: called with (done, total) after each one.

        Raises:
            ConfigurationError: a bad filter value, naming it.
        """
        records, skipped = await self._resolve(ids_or_filter)
        report = ReplayReport(skipped=skipped, dry_run=dry_run)
        for done, record in enumerate(records, 1):
            try:
                result = await self._replay_one(record, dry_run)
            except (InvalidAssignment, InvalidStreamName, _CannotReplay) as exc:
                report.skipped.append((record.id, str(exc)))
            else:
                if result is None:
                    report.skipped.append((record.id, "already replayed or purged"))
                else:
                    report.replayed.append(result)
            if progress is not None:
                progress(done, len(records))
        return report

    async def _replay_one(self, record: DeadLetterRecord, dry_run: bool) -> Replayed | None:
        gw, keys = self._gw, self._keys
        fields = dict(record.fields)
        if record.is_assignment:
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
            new_id = await gw.replay_assignment(record.id, stream, list(fields.items()))
            if new_id is None:
                return None
            if stream:
                await gw.clear_retention(stream)
            return Replayed(record.id, new_id, keys.assignments)
        stream = record.source_stream
        if not stream:
            raise _CannotReplay("it names no source stream")
        keys.check_data_stream(stream)
        if not fields:
            raise _CannotReplay("it carries no fields")
        if 2 * len(fields) > MAX_COPY_VALUES:
            raise _CannotReplay(f"{len(fields)} fields: too many for one script call")
        unfinished = await gw.active_id(stream) is not None or await gw.lock_exists(stream)
        if dry_run:
            return Replayed(record.id, "", stream, reassigned=not unfinished)
        new_id, appended = await gw.replay_entry(
            stream,
            record.id,
            list(fields.items()),
            close=not unfinished,
            marker_ttl_ms=REPLAY_MARKER_TTL_MS,
        )
        reassign = not unfinished and (appended or not await self._delivered(stream, new_id))
        if reassign:
            await gw.add_assignment(stream, build_fields(stream, {}))
            await gw.clear_retention(stream)
        await gw.delete_dead_letters([record.id])
        return Replayed(record.id, new_id, stream, reassigned=reassign)

    async def _delivered(self, stream: str, entry_id: str) -> bool:
        """Whether the group has read past ``entry_id`` (an earlier replay's job ran)."""
        row = (await self._gw.stream_rows([stream]))[0]
        if not row.last_delivered:
            return False
        return _order(row.last_delivered) >= _order(entry_id)

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
            await self._gw.delete_dead_letters(chunk)
            deleted += chunk
            if progress is not None:
                progress(len(deleted), len(ids))
        return deleted


class _CannotReplay(Exception):
    pass


def _order(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def _check_id(entry_id: str) -> None:
    ms, sep, seq = entry_id.partition("-")
    if not (ms.isdigit() and (not sep or seq.isdigit())):
        raise ConfigurationError(
            "id", f"{entry_id!r} is not a stream entry id (like 1700000000000-0)"
        )
