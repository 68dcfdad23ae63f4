"""The assignment stream: intake, pending pages, finishing, re-queueing, dead letters."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis import exceptions as rex

from .._deadletter import (
    DEAD_AT_FIELD,
    FIELDS_JSON_FIELD,
    META_FIELDS,
    SOURCE_ID_FIELD,
    SOURCE_STREAM_FIELD,
    Pairs,
    flatten,
)
from .._keys import Keys
from .._wire import (
    FIRST_ID_FIELD,
    LOST_AT_FIELD,
    RETRY_FIELD,
    STREAM_FIELD,
)
from ..metrics import ServiceSample
from ._boundary import (
    DEAD_MARKER_TTL_MS,
    PLAIN_DEAD_LETTER_BYTES,
    Core,
    LostAt,
    blocking,
    channelled,
    script,
    translate,
    translated,
)
from ._protocol import (
    Pending,
)
from ._replies import (
    RawFields,
    _raw_fields,
    raw,
    text,
)
from ._scripts import NAMES, Scripts, source


class AssignmentCommands:
    """The assignment stream: intake, pending pages, finishing, re-queueing, dead letters."""

    def __init__(self, core: Core) -> None:
        self.core = core
        self.client: Any = core.client
        self.keys: Keys = core.keys
        self.scripts: Scripts = core.scripts

    # -- assignment stream ---------------------------------------------------------

    @translated
    async def load_scripts(self) -> None:
        """SCRIPT LOAD every script (on every primary of a cluster), so that the first
        calls need no retry, and a missing ``script|load`` permission shows at start-up."""
        for name in NAMES:
            await self.client.script_load(source(name))

    @translated
    async def ensure_group(self) -> None:
        """Create the LBS consumer group at id 0 (MKSTREAM); an existing group is fine."""
        try:
            await self.client.xgroup_create(
                self.keys.assignments, self.keys.group, id="0", mkstream=True
            )
        except rex.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    @blocking
    async def read_assignments(
        self, consumer: str, count: int, block_ms: int
    ) -> list[tuple[str, RawFields]]:
        """New assignments for ``consumer``, never its own pending ones: a restarted
        consumer gets its stranded work back only through recovery, which counts it
        (docs/design.md#recovery)."""
        reply = await self.client.xreadgroup(
            self.keys.group,
            consumer,
            {self.keys.assignments: ">"},
            count=count,
            block=block_ms,
        )
        out: list[tuple[str, RawFields]] = []
        if not reply:
            return out
        streams = reply.values() if isinstance(reply, dict) else [r[1] for r in reply]
        for batch in streams:
            if batch and isinstance(batch[0], list) and not isinstance(batch[0][0], bytes | str):
                batch = batch[0]  # RESP3 nests one level deeper
            for entry_id, fields in batch:
                out.append((text(entry_id), _raw_fields(fields)))
        return out

    @translated
    async def fetch_assignment(self, entry_id: str) -> RawFields | None:
        """The fields of one LBS entry, or None if it was deleted."""
        reply = await self.client.xrange(self.keys.assignments, entry_id, entry_id, count=1)
        if not reply:
            return None
        return _raw_fields(reply[0][1])

    @translated
    async def pending_page(
        self, min_idle_ms: int, start: str, count: int, consumer: str | None = None
    ) -> list[Pending]:
        """One XPENDING page (ids >= ``start``) of entries idle at least ``min_idle_ms``,
        of every consumer or only of ``consumer``."""
        reply = await self.client.xpending_range(
            self.keys.assignments,
            self.keys.group,
            start,
            "+",
            count,
            consumername=consumer,
            idle=min_idle_ms,
        )
        return [
            Pending(
                id=text(p["message_id"]),
                consumer=text(p["consumer"]),
                idle_ms=int(p["time_since_delivered"]),
            )
            for p in reply
        ]

    @translated
    async def pending_owner(self, entry_id: str) -> str:
        """The consumer an LBS entry is pending with ('' if it is not pending)."""
        reply = await self.client.xpending_range(
            self.keys.assignments, self.keys.group, entry_id, entry_id, 1
        )
        return text(reply[0]["consumer"]) if reply else ""

    @translated
    async def lease_scores(self, ids: Sequence[str]) -> list[float | None]:
        """Lease deadlines (server ms) of assignment ids; None where there is none."""
        if not ids:
            return []
        reply = await self.client.zmscore(self.keys.leases, list(ids))
        return [None if v is None else float(v) for v in reply]

    @translated
    async def server_time_ms(self) -> int:
        now_s, now_us = await self.client.time()
        return int(now_s) * 1000 + int(now_us) // 1000

    @translated
    async def ping(self) -> None:
        await self.client.ping()

    @translated
    async def sample(self) -> ServiceSample:
        """Pending assignments and the oldest one's age, the DLQ's length and the
        consumer names of the group: four reads, none of them proportional to the
        data (XPENDING's summary form, XLEN, XINFO GROUPS, TIME)."""
        summary = await self.client.xpending(self.keys.assignments, self.keys.group)
        dlq_length = await self.client.xlen(self.core.dlq)
        groups = await self.client.xinfo_groups(self.keys.assignments)
        now_ms = await self.server_time_ms()
        pending = int(summary.get("pending", 0) or 0)
        oldest = summary.get("min")
        age_s = 0.0
        if pending and oldest:
            age_s = max(0.0, (now_ms - int(text(oldest).split("-")[0])) / 1000)
        consumers = next(
            (int(g["consumers"]) for g in groups if text(g["name"]) == self.keys.group), 0
        )
        return ServiceSample(
            pending=pending, oldest_pending_age_s=age_s, dlq_length=dlq_length, consumers=consumers
        )

    @channelled
    async def finish(self, assignment_id: str) -> bool:
        """Ack and delete a completed assignment; False if it was no longer pending.

        Its lease goes, and its stream's entry in the active-assignment index if that
        points at it (the script reads the stream's name from the entry).
        """
        r = await self.scripts.finish(
            keys=[self.keys.assignments, self.keys.leases, self.keys.active],
            args=[self.keys.group, assignment_id, STREAM_FIELD],
        )
        return int(r) == 1

    @channelled
    async def requeue(
        self, assignment_id: str, retry_count: int | None, *, lost_at: LostAt = None
    ) -> str | None:
        """Atomic XACK-first re-queue; ``retry_count`` None keeps the entry's own count.

        ``lost_at`` is when the previous owner was lost (server ms), or ``"lease"`` (the
        entry's lease deadline, or now), for a recovery; the copy carries it in
        ``_lost_at``. None for anything else (a hand-back): the copy has no such field.

        Returns the new entry's id, or None if the entry was not pending (someone else
        re-queued or finished it). Its lease is forgotten either way. If the active-
        assignment index pointed at the entry it points at the copy (the script reads
        the stream's name from the entry, so every caller keeps the index right).

        Raises:
            EntryTooLarge: the entry has too many fields to copy; it is still pending
                and its lease is kept (nothing was written).
            WrongKeyType: the assignment stream is not a stream (nothing was written).
        """
        r = await self.scripts.requeue(
            keys=[self.keys.assignments, self.keys.leases, self.keys.active],
            args=[
                self.keys.group,
                assignment_id,
                RETRY_FIELD,
                "" if retry_count is None else str(retry_count),
                self.core.max_copy_values,
                STREAM_FIELD,
                FIRST_ID_FIELD,
                LOST_AT_FIELD,
                "" if lost_at is None else str(lost_at),
            ],
        )
        return None if r is None else text(r)

    @script
    async def dead_letter_assignment(
        self, assignment_id: str, meta: Pairs
    ) -> tuple[str, int] | None:
        """Atomic XACK, XADD to the DLQ, XDEL; None if the entry was not pending.

        An entry too large to copy field by field is carried in ``_fields_json``. Its
        stream's entry in the active-assignment index goes if it points at it.

        Returns:
            (dead letter id, entries trimmed off the DLQ by MAXLEN).

        Raises:
            WrongKeyType: the dead-letter key holds another type; nothing was written,
                the entry is still pending.
        """
        r = await self.scripts.dead_letter_assignment(
            keys=[
                self.keys.assignments,
                self.core.dlq,
                self.keys.leases,
                self.keys.active,
            ],
            args=[
                self.keys.group,
                assignment_id,
                self.core.dlq_maxlen,
                DEAD_AT_FIELD,
                FIELDS_JSON_FIELD,
                self.core.max_copy_values,
                STREAM_FIELD,
                *raw(flatten(meta)),
            ],
        )
        if r is None:
            return None
        return text(r[0]), int(r[1])

    @script
    async def dead_letter_entry(self, fields: Pairs) -> tuple[str, int]:
        """Append a dead letter for a data-stream entry; returns (id, entries trimmed).

        ``fields`` are the original fields and the metadata (told apart by name, see
        ``_deadletter.entry_dead_letter``). An entry too large to copy field by field is
        carried in ``_fields_json``.

        Raises:
            WrongKeyType: the dead-letter key holds another type; nothing was written.
        """
        meta = [pair for pair in fields if pair[0] in META_FIELDS]
        original = [pair for pair in fields if pair[0] not in META_FIELDS]
        found = dict(meta)
        marker = self.keys.dead_marker(
            found.get(SOURCE_STREAM_FIELD, ""), found.get(SOURCE_ID_FIELD, "")
        )
        if (
            sum(len(k) + len(v) for k, v in original) > PLAIN_DEAD_LETTER_BYTES
            and 2 * (len(fields) + 1) <= self.core.max_copy_values
            and all(k != FIELDS_JSON_FIELD for k, _ in original)
        ):
            return await self._dead_letter_plain(meta, original, marker)
        r = await self.scripts.dead_letter_entry(
            keys=[self.core.dlq, marker],
            args=[
                self.core.dlq_maxlen,
                DEAD_AT_FIELD,
                FIELDS_JSON_FIELD,
                self.core.max_copy_values,
                2 * len(meta),
                *raw(flatten(meta)),
                *raw(flatten(original)),
                DEAD_MARKER_TTL_MS,
            ],
        )
        return text(r[0]), int(r[1])

    async def _dead_letter_plain(
        self, meta: Pairs, original: Pairs, marker: str
    ) -> tuple[str, int]:
        """``dead_letter_entry.lua`` without the script, for a big entry: one MULTI of XLEN, XADD,
        XLEN on the dead-letter stream, so the entry's data never passes through Lua.
        The marker is read before and set after: unlike the script, not atomic with the
        write, so a crash right after the MULTI, or two owners dead-lettering the same
        big entry at once (a disowned one's call in flight), can still duplicate it."""
        done = await self.client.get(marker)
        if done is not None:
            return text(done), 0
        now_ms = await self.server_time_ms()
        trim: tuple[Any, ...] = (
            ("MAXLEN", "~", self.core.dlq_maxlen) if self.core.dlq_maxlen > 0 else ()
        )
        flat = raw(flatten([*original, *meta, (DEAD_AT_FIELD, str(now_ms))]))
        replies = await self.core.transaction(
            self.core.dlq,
            [
                ("XLEN", self.core.dlq),
                ("XADD", self.core.dlq, *trim, "*", *flat),
                ("XLEN", self.core.dlq),
            ],
            large=True,  # its write must not hold up the channel's other callers
        )
        for reply in replies:
            if isinstance(reply, BaseException):
                raise translate(reply) from reply
        before, dlq_id, after = replies
        await self.client.set(marker, dlq_id, px=DEAD_MARKER_TTL_MS)
        return text(dlq_id), int(before) + 1 - int(after)
