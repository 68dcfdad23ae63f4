"""What a service is doing, from Redis alone: who owns what, what waits, what died
(docs/operations.md#status). ``streamjobs status`` prints :meth:`Inspector.overview`.

Every read is pipelined and paged; nothing uses KEYS or SCAN. The cost is a few round
trips per 500 pending assignments: a service with 10,000 owned streams is read in
well under a second.
"""

from __future__ import annotations

import enum
import json
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from ._deadletter import REASON_FIELD, SOURCE_STREAM_FIELD
from ._redis._operator import owner_of
from ._service_tool import ServiceTool
from ._wire import parse_assignment, parse_retry_count, stream_name_of
from .exceptions import InvalidAssignment, StreamJobsError

MAX_PENDING = 100_000
"""Most pending assignments :meth:`Inspector.overview` reads."""
DLQ_SAMPLE = 10_000
"""Most dead letters read (newest first) to count them by reason."""


class UnknownService(StreamJobsError):
    """The service's assignment stream has no consumer group: no consumer of it ever
    ran against this Redis (or the name or the key prefix is wrong)."""


@dataclass(frozen=True, slots=True)
class ConsumerStatus:
    name: str
    alive: bool
    """It has a live session key (renewed by its heartbeat), or holds a lock."""
    idle_s: float
    """Since it last read the assignment stream."""
    pending: int
    """Assignments delivered to it and not finished."""
    owned_streams: int
    stopped: bool = False
    """Not alive, and its last run stopped cleanly (every stream handed back): not a
    crash. Recorded for a day after the stop."""

    @property
    def state(self) -> str:
        """``alive``, ``stopped`` or ``dead`` (what ``streamjobs status`` shows)."""
        return "alive" if self.alive else "stopped" if self.stopped else "dead"


@dataclass(frozen=True, slots=True)
class OwnedStreamStatus:
    stream: str
    owner: str
    assignment_id: str
    retry_count: int
    owned_for_s: float
    """Since its assignment was delivered to the owner."""
    lock_ttl_s: float
    pending: int | None
    """Entries delivered to the owner and not acked yet (None: no group)."""
    lag: int | None
    """Entries not read yet (None: unknown to the server, or no group)."""


@dataclass(frozen=True, slots=True)
class PendingAssignment:
    """Delivered to a consumer that holds no lock for it: awaiting recovery (its
    consumer died or stalled), or between delivery and taking the lock."""

    assignment_id: str
    stream: str
    consumer: str
    idle_s: float
    deliveries: int
    retry_count: int


@dataclass(frozen=True, slots=True)
class DeadLetterSummary:
    stream: str
    length: int
    by_reason: dict[str, int]
    counted: int
    """Dead letters read to count ``by_reason`` (the newest; at most ``DLQ_SAMPLE``)."""


@dataclass(frozen=True, slots=True)
class GroupMemberStatus:
    """One member of a shared group (docs/shared-groups.md#sessions)."""

    member: str
    """Its name in the consumer group: the consumer's name and an incarnation
    (``name~3f2a91c0``), or another client's name."""
    consumer: str
    state: str
    """``alive``, ``stopped``, ``dead``, or ``unknown`` (a name with no session: another
    client of the group; its entries are reclaimed after ``min_idle_s``)."""
    pending: int
    idle_s: float | None
    """Since it last read (None: not in the group any more)."""


@dataclass(frozen=True, slots=True)
class GroupStatus:
    """The service's shared group (``GroupConsumer``) on one stream."""

    stream: str
    exists: bool
    """The stream has the group (False: the stream or its group was deleted)."""
    pending: int
    """Entries delivered to a member and not acknowledged."""
    lag: int | None
    """Entries not delivered yet (None: unknown to the server)."""
    oldest_pending_age_s: float
    """Age of the oldest pending entry, from its id (0 if none)."""
    members: list[GroupMemberStatus]

    def count(self, state: str) -> int:
        return sum(1 for m in self.members if m.state == state)


@dataclass(frozen=True, slots=True)
class Overview:
    """A service's state: what ``streamjobs status`` prints (``--json``: :meth:`to_json`)."""

    service: str
    queued: int
    """Assignments not delivered to any consumer yet."""
    oldest_pending_age_s: float
    """Age of the oldest delivered, unfinished assignment, from its id (0 if none)."""
    consumers: list[ConsumerStatus]
    streams: list[OwnedStreamStatus]
    pending: list[PendingAssignment]
    dlq: DeadLetterSummary
    taken_at: float = field(default_factory=time.time)
    groups: list[GroupStatus] = field(default_factory=list)
    """The service's shared groups, one per stream (``GroupConsumer``)."""

    def to_json(self) -> dict[str, Any]:
        """The stable JSON form (docs/operations.md#status): top-level keys
        ``service``, ``consumers``, ``streams``, ``pending`` and ``dlq``."""
        return {
            "service": {
                "name": self.service,
                "queued": self.queued,
                "delivered": len(self.streams) + len(self.pending),
                "oldest_pending_age_s": round(self.oldest_pending_age_s, 3),
                "taken_at": round(self.taken_at, 3),
            },
            "consumers": [{**asdict(c), "state": c.state} for c in self.consumers],
            "streams": [asdict(s) for s in self.streams],
            "pending": [asdict(p) for p in self.pending],
            "dlq": asdict(self.dlq),
            "groups": [asdict(g) for g in self.groups],
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2, sort_keys=False)


class StreamState(enum.Enum):
    QUEUED = "queued"
    """An assignment waits: not delivered yet, or delivered to a consumer that died
    before (or after) taking the lock and not recovered yet."""
    OWNED = "owned"
    """A consumer holds its lock."""
    FINISHED = "finished"
    """Its end marker was handled and its assignment is gone."""
    DEAD_LETTERED = "dead_lettered"
    """Its assignment is in the dead-letter stream."""
    UNKNOWN = "unknown"
    """None of the above: never submitted, or finished and deleted by its retention."""


@dataclass(frozen=True, slots=True)
class StreamStatus:
    stream: str
    state: StreamState
    assignment_id: str = ""
    owner: str = ""
    """``OWNED``: the consumer holding the lock; ``QUEUED``: the one it was delivered to."""
    since: float | None = None
    """``OWNED``/``QUEUED``: when its assignment was delivered (epoch seconds)."""
    lock_ttl_s: float | None = None
    pending: int | None = None
    lag: int | None = None
    dead_letter_ids: tuple[str, ...] = ()
    detail: str = ""


def _retry(fields: dict[str, str]) -> int:
    try:
        return parse_retry_count(fields)
    except InvalidAssignment:
        return 0


class Inspector(ServiceTool):
    """Reads a service's state. Read-only: it never writes to Redis.

    Args:
        redis: a ``redis.asyncio.Redis`` or ``RedisCluster`` (not closed here); the
            inspector only reads through it.
        service: the service to inspect.
        key_prefix: the consumers' ``ConsumerConfig.key_prefix``.
        dlq_stream: the consumers' ``RecoveryConfig.dlq_stream``, if they set one.
    """

    async def check_service(self, *, queued_only: bool = False) -> None:
        """Raises:
        UnknownService: the service's assignment stream has no consumer group here
            (with ``queued_only``: neither the assignment stream nor the dead-letter
            stream exists, so a service whose work was queued before any consumer
            ran still counts).
        """
        if queued_only and await self._gw.operator.any_exists(self._keys.assignments, self._gw.dlq):
            return
        if (
            not await self._gw.operator.group_exists()
            and not await self._gw.operator.group_streams()
        ):
            raise UnknownService(
                f"no service {self._keys.service!r} here: {self._keys.assignments} has no "
                f"consumer group {self._keys.group!r} (no consumer of it has run against "
                "this Redis; check the name, the key prefix and the database)"
            )

    async def overview(self) -> Overview:
        """Consumers, owned streams, pending assignments without an owner, the oldest
        pending age and the DLQ by reason.

        Raises:
            UnknownService: the service has no consumer group here.
            RedisUnavailable: Redis could not be reached.
        """
        await self.check_service()
        gw = self._gw
        now_ms = await gw.assignments.server_time_ms()
        groups = await self._groups(now_ms)
        if not await gw.operator.group_exists():  # only shared groups
            return Overview(
                service=self._keys.service,
                queued=await gw.operator.queue_length(),
                oldest_pending_age_s=0.0,
                consumers=[],
                streams=[],
                pending=[],
                dlq=await self._dlq_summary(),
                groups=groups,
            )
        consumers = await gw.operator.consumers()
        pending = await gw.operator.pending_all(MAX_PENDING)
        fields = await gw.operator.assignment_fields([p.id for p in pending])
        names = [stream_name_of(f) if f else "" for f in fields]
        rows = await gw.operator.stream_rows([n for n in names if n])
        by_name = dict(zip([n for n in names if n], rows, strict=True))
        streams: list[OwnedStreamStatus] = []
        orphans: list[PendingAssignment] = []
        owned_by: Counter[str] = Counter()
        for p, f, name in zip(pending, fields, names, strict=True):
            row = by_name.get(name)
            owner = owner_of(row.holder) if row is not None else ""
            retry = _retry(f) if f else 0
            if row is not None and row.holder is not None:
                owned_by[owner] += 1
                streams.append(
                    OwnedStreamStatus(
                        stream=name,
                        owner=owner,
                        assignment_id=p.id,
                        retry_count=retry,
                        owned_for_s=p.idle_ms / 1000,
                        lock_ttl_s=max(0, row.ttl_ms) / 1000,
                        pending=row.pending,
                        lag=row.lag,
                    )
                )
            else:
                orphans.append(
                    PendingAssignment(p.id, name, p.consumer, p.idle_ms / 1000, p.deliveries, retry)
                )
        names = [c.name for c in consumers]
        alive = await gw.operator.sessions(names)
        stopped = await gw.operator.stopped(names)
        consumer_rows = [
            ConsumerStatus(
                name=c.name,
                alive=live or owned_by[c.name] > 0,
                idle_s=c.idle_ms / 1000,
                pending=c.pending,
                owned_streams=owned_by[c.name],
                stopped=ended,
            )
            for c, live, ended in zip(consumers, alive, stopped, strict=True)
        ]
        oldest = 0.0
        if pending:
            first_ms = min(int(p.id.split("-")[0]) for p in pending)
            oldest = max(0.0, (now_ms - first_ms) / 1000)
        return Overview(
            service=self._keys.service,
            queued=max(0, await gw.operator.queue_length() - len(pending)),
            oldest_pending_age_s=oldest,
            consumers=consumer_rows,
            streams=streams,
            pending=orphans,
            dlq=await self._dlq_summary(),
            groups=groups,
        )

    async def groups(self) -> list[GroupStatus]:
        """The service's shared groups (``GroupConsumer``), one per stream a consumer
        joined: members (alive, stopped, dead), pending, lag, oldest pending age.

        Raises:
            RedisUnavailable: Redis could not be reached.
        """
        return await self._groups(await self._gw.assignments.server_time_ms())

    async def _groups(self, now_ms: int) -> list[GroupStatus]:
        gw = self._gw
        streams = await gw.operator.group_streams()
        out = []
        for stream, row in zip(streams, await gw.operator.group_rows(streams), strict=True):
            in_group = {name: (pending, idle) for name, pending, idle in row.consumers}
            members = []
            for name in sorted(set(row.members) | set(in_group)):
                score = row.members.get(name)
                state = (
                    "unknown"
                    if score is None
                    else "stopped"
                    if score < 0
                    else "alive"
                    if score > now_ms
                    else "dead"
                )
                pending, idle = in_group.get(name, (0, None))
                members.append(
                    GroupMemberStatus(
                        member=name,
                        consumer=name.rsplit("~", 1)[0] if score is not None else name,
                        state=state,
                        pending=pending,
                        idle_s=None if idle is None else idle / 1000,
                    )
                )
            oldest = 0.0
            if row.oldest_pending_id:
                first_ms = int(row.oldest_pending_id.split("-")[0])
                oldest = max(0.0, (now_ms - first_ms) / 1000)
            out.append(GroupStatus(stream, row.exists, row.pending, row.lag, oldest, members))
        return out

    async def _dlq_summary(self) -> DeadLetterSummary:
        gw = self._gw
        length = await gw.operator.dlq_length()
        reasons: Counter[str] = Counter()
        counted = 0
        start = "+"
        while counted < min(length, DLQ_SAMPLE):
            page = await gw.operator.dlq_page(
                start, "-", min(500, DLQ_SAMPLE - counted), reverse=True
            )
            if not page:
                break
            for _, f in page:
                reasons[f.get(REASON_FIELD, "") or "unknown"] += 1
            counted += len(page)
            start = f"({page[-1][0]}"
        return DeadLetterSummary(gw.dlq, length, dict(reasons.most_common()), counted)

    async def stream_status(self, name: str) -> StreamStatus:
        """Where data stream ``name``'s job stands.

        Only assignments queued by ``Producer.add_stream`` are found while queued;
        any assignment is found while owned.

        Raises:
            InvalidStreamName: ``name`` cannot be a data stream of this service.
        """
        self._keys.check_data_stream(name)
        gw = self._gw
        row = (await gw.operator.stream_rows([name]))[0]
        if row.holder is not None:
            owner = owner_of(row.holder)
            delivered = await self._delivery(owner, name)
            return StreamStatus(
                stream=name,
                state=StreamState.OWNED,
                assignment_id=delivered[0] if delivered else "",
                owner=owner,
                since=delivered[1] if delivered else None,
                lock_ttl_s=max(0, row.ttl_ms) / 1000,
                pending=row.pending,
                lag=row.lag,
            )
        active = await gw.operator.active_id(name)
        if active is not None:
            pending = await gw.assignments.pending_owner(active)
            detail = (
                f"delivered to {pending!r}, which holds no lock: awaiting recovery"
                if pending
                else "waiting for a consumer"
            )
            return StreamStatus(
                stream=name,
                state=StreamState.QUEUED,
                assignment_id=active,
                owner=pending,
                lag=row.lag,
                detail=detail,
            )
        dead = await self._dead_assignments(name)
        if dead:
            return StreamStatus(
                stream=name,
                state=StreamState.DEAD_LETTERED,
                dead_letter_ids=tuple(dead),
                detail=f"{len(dead)} dead letter(s) of its assignment",
            )
        if row.pending is not None and row.lag == 0 and row.pending == 0:
            return StreamStatus(
                stream=name, state=StreamState.FINISHED, pending=0, lag=0,
                detail="every entry read and acknowledged; no assignment left",
            )  # fmt: skip
        return StreamStatus(
            stream=name, state=StreamState.UNKNOWN, pending=row.pending, lag=row.lag
        )

    async def _delivery(self, owner: str, stream: str) -> tuple[str, float] | None:
        """The pending assignment of ``stream`` delivered to ``owner``, and when: from
        the index if ``add_stream`` queued it, else by reading the pending list."""
        active = await self._gw.operator.active_id(stream)
        if active is not None:
            row = await self._gw.operator.pending_one(active)
            if row is not None:
                return row.id, time.time() - row.idle_ms / 1000
        for p in await self._gw.operator.pending_all(MAX_PENDING):
            if p.consumer != owner:
                continue
            f = (await self._gw.operator.assignment_fields([p.id]))[0]
            if f is not None and stream_name_of(f) == stream:
                return p.id, time.time() - p.idle_ms / 1000
        return None

    async def _dead_assignments(self, stream: str) -> list[str]:
        """Ids of dead letters of assignments naming ``stream`` (newest first)."""
        found: list[str] = []
        start = "+"
        seen = 0
        while seen < DLQ_SAMPLE:
            page = await self._gw.operator.dlq_page(start, "-", 500, reverse=True)
            if not page:
                break
            for entry_id, f in page:
                if f.get(SOURCE_STREAM_FIELD) == self._keys.assignments:
                    try:
                        named = parse_assignment(entry_id, f).stream
                    except InvalidAssignment:
                        named = stream_name_of(f)
                    if named == stream:
                        found.append(entry_id)
            seen += len(page)
            start = f"({page[-1][0]}"
        return found
