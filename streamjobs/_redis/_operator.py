"""The Redis commands of the operator tools (``Inspector``, ``DeadLetters``, the CLI's
``status``, ``dlq`` and ``consumers`` commands): reads of a service's state, pipelined
and paged, and the scripts that replay, purge and prune.

Part of the Redis boundary (``_redis``): the same error translation, and nothing
else in the package sends these commands. Nothing here reads a key it cannot name:
no KEYS, no SCAN. On a cluster a pipeline of keys in many slots is split by the client
per node, still one round trip per node per chunk.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .._keys import Keys
from .._session import parse_session_token
from ._boundary import Core, script, translated
from ._replies import id_order, raw, sized_entries, text
from ._scripts import Scripts

CHUNK = 1000
"""Commands per pipeline round trip."""


@dataclass(frozen=True, slots=True)
class ConsumerRow:
    name: str
    pending: int
    idle_ms: int


@dataclass(frozen=True, slots=True)
class PendingRow:
    id: str
    consumer: str
    idle_ms: int
    deliveries: int


@dataclass(frozen=True, slots=True)
class StreamRow:
    """One data stream's lock and group, as one pipelined round trip read them."""

    holder: str | None
    """The lock's token, or None."""
    ttl_ms: int
    """The lock's remaining TTL (-2 without a lock)."""
    pending: int | None
    """Entries pending in the service's group; None if the stream or group is missing."""
    lag: int | None
    """Entries not yet read by the group (None: unknown, or no group)."""
    last_delivered: str


@dataclass(frozen=True, slots=True)
class GroupRow:
    """The service's shared group on one stream, as read by :meth:`group_rows`."""

    exists: bool
    pending: int
    lag: int | None
    oldest_pending_id: str
    members: dict[str, float]
    """Member index: member -> deadline (ms), or minus the time it stopped."""
    consumers: list[tuple[str, int, int]]
    """The group's consumers: (name, pending, idle ms)."""


@dataclass(frozen=True, slots=True)
class EntryReplay:
    """What ``replay_entry.lua`` did with a batch of one data stream's dead entries."""

    state: str
    """``placed`` (in the stream, not all read yet), ``delivered`` (appended by an
    earlier call and all read by the group), or ``busy`` (nothing written: the stream's
    job is ending or being cancelled; try again once it has)."""
    closed: bool
    """An end marker the group has not read follows the entries: a job must be queued."""
    owned: bool
    """A consumer holds the stream's lock: its owner reads on to the entries."""
    ids: list[str]
    """The id of each dead letter's entry in the stream (empty when ``busy``)."""


def _groups(reply: Any) -> list[dict[str, Any]]:
    """XINFO GROUPS as dicts with str keys, whether redis-py parsed it or not."""
    if isinstance(reply, BaseException) or not reply:
        return []
    out = []
    for g in reply:
        pairs = g.items() if isinstance(g, dict) else zip(g[::2], g[1::2], strict=True)
        out.append({text(k): v for k, v in pairs})
    return out


def owner_of(token: str | None) -> str:
    """The consumer name in a lock token (``name:random``, or a session's token:
    docs/design.md#liveness)."""
    if not token:
        return ""
    parsed = parse_session_token(token)
    return token.rsplit(":", 1)[0] if parsed is None else parsed.consumer


class OperatorCommands:
    """Reads and scripts of the operator tools, for one service."""

    def __init__(self, core: Core) -> None:
        self.core = core
        self.client: Any = core.client
        self.keys: Keys = core.keys
        self.scripts: Scripts = core.scripts

    async def _pipelined(self, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        """Run ``commands`` in pipelines of :data:`CHUNK` (no transaction); error
        replies come back in place, as exceptions."""
        out: list[Any] = []
        for start in range(0, len(commands), CHUNK):
            async with self.client.pipeline(transaction=False) as pipe:
                for command in commands[start : start + CHUNK]:
                    pipe.execute_command(*command)
                out.extend(await pipe.execute(raise_on_error=False))
        return out

    @translated
    async def group_exists(self) -> bool:
        """The assignment stream exists and has the service's group."""
        if not await self.client.exists(self.keys.assignments):
            return False
        groups = _groups(await self.client.xinfo_groups(self.keys.assignments))
        return any(text(g.get("name", "")) == self.keys.group for g in groups)

    @translated
    async def any_exists(self, *keys: str) -> bool:
        """Whether any of ``keys`` exists (one EXISTS per key: they may lie in
        different slots)."""
        for key in keys:
            if await self.client.exists(key):
                return True
        return False

    @translated
    async def group_streams(self) -> list[str]:
        """The streams ``GroupConsumer`` of this service joined, sorted."""
        return sorted(text(s) for s in await self.client.smembers(self.keys.group_streams))

    @translated
    async def group_rows(self, streams: Sequence[str]) -> list[GroupRow]:
        """The service's group on each of ``streams``: its pending count, lag and
        oldest pending id, the member index, and the group's consumers."""
        commands: list[tuple[Any, ...]] = []
        for s in streams:
            commands += [
                ("XINFO", "GROUPS", s),
                ("XPENDING", s, self.keys.group),
                ("ZRANGE", self.keys.members(s), 0, -1, "WITHSCORES"),
                ("XINFO", "CONSUMERS", s, self.keys.group),
            ]
        replies = await self._pipelined(commands)
        rows = []
        for i in range(0, len(replies), 4):
            groups, summary, index, consumers = replies[i : i + 4]
            mine = next(
                (g for g in _groups(groups) if text(g.get("name", "")) == self.keys.group),
                None,
            )
            lag = None if mine is None else mine.get("lag")
            oldest = ""
            if isinstance(summary, dict):
                first = summary.get("min")
            elif isinstance(summary, list | tuple) and len(summary) > 1:
                first = summary[1]
            else:
                first = None
            if first is not None:
                oldest = text(first)
            members: dict[str, float] = {}
            if isinstance(index, list | tuple) and index:
                pairs = (
                    index
                    if isinstance(index[0], list | tuple)
                    else list(zip(index[::2], index[1::2], strict=True))
                )
                members = {text(m): float(score) for m, score in pairs}
            named: list[tuple[str, int, int]] = []
            if isinstance(consumers, list | tuple):
                for c in consumers:
                    items = c.items() if isinstance(c, dict) else zip(c[::2], c[1::2], strict=True)
                    info = {text(k): v for k, v in items}
                    named.append((text(info["name"]), int(info["pending"]), int(info["idle"])))
            rows.append(
                GroupRow(
                    exists=mine is not None,
                    pending=0 if mine is None else int(mine["pending"]),
                    lag=None if lag is None else int(lag),
                    oldest_pending_id=oldest,
                    members=members,
                    consumers=named,
                )
            )
        return rows

    @translated
    async def consumers(self) -> list[ConsumerRow]:
        """XINFO CONSUMERS of the assignment group."""
        reply = await self.client.xinfo_consumers(self.keys.assignments, self.keys.group)
        return [
            ConsumerRow(text(c["name"]), int(c["pending"]), int(c["idle"]))
            for c in ({text(k): v for k, v in c.items()} for c in reply)
        ]

    @translated
    async def pending_all(self, limit: int) -> list[PendingRow]:
        """The assignment group's pending list, oldest first, in pages of 1,000."""
        rows: list[PendingRow] = []
        start = "-"
        while len(rows) < limit:
            page = await self.client.xpending_range(
                self.keys.assignments,
                self.keys.group,
                start,
                "+",
                min(1000, limit - len(rows)),
            )
            rows.extend(
                PendingRow(
                    text(p["message_id"]),
                    text(p["consumer"]),
                    int(p["time_since_delivered"]),
                    int(p["times_delivered"]),
                )
                for p in page
            )
            if len(page) < 1000:
                break
            start = f"({rows[-1].id}"
        return rows

    @translated
    async def pending_one(self, entry_id: str) -> PendingRow | None:
        """The pending-list row of one assignment, if it is pending."""
        page = await self.client.xpending_range(
            self.keys.assignments, self.keys.group, entry_id, entry_id, 1
        )
        if not page:
            return None
        p = page[0]
        return PendingRow(
            text(p["message_id"]),
            text(p["consumer"]),
            int(p["time_since_delivered"]),
            int(p["times_delivered"]),
        )

    @translated
    async def assignment_fields(self, ids: Sequence[str]) -> list[dict[str, str] | None]:
        """The fields of assignment entries, by id (None where one is gone).

        Pending assignments are mostly the oldest entries of the assignment stream, so
        the range from the first to the last id is read in pages of 1,000 (plain
        XRANGE), unless it holds many more entries than asked for: then by id.
        """
        if not ids:
            return []
        first, last = min(ids, key=id_order), max(ids, key=id_order)
        found: dict[str, dict[str, str]] = {}
        start = first
        while len(found) <= 2 * len(ids):
            page, _ = sized_entries(
                await self.client.xrange(self.keys.assignments, start, last, count=1000)
            )
            found.update(page)
            if len(page) < 1000:
                return [found.get(i) for i in ids]
            start = f"({page[-1][0]}"
        replies = await self._pipelined(
            [("XRANGE", self.keys.assignments, i, i, "COUNT", 1) for i in ids]
        )
        out: list[dict[str, str] | None] = []
        for reply in replies:
            entries = [] if isinstance(reply, BaseException) else sized_entries(reply)[0]
            out.append(entries[0][1] if entries else None)
        return out

    @translated
    async def stream_rows(self, streams: Sequence[str]) -> list[StreamRow]:
        """Lock holder, lock TTL, and the group's pending count and lag, per stream."""
        commands: list[tuple[Any, ...]] = []
        for s in streams:
            lock = self.keys.lock(s)
            commands += [("GET", lock), ("PTTL", lock), ("XINFO", "GROUPS", s)]
        replies = await self._pipelined(commands)
        rows = []
        for i in range(0, len(replies), 3):
            holder, ttl, groups = replies[i : i + 3]
            mine = next(
                (g for g in _groups(groups) if text(g.get("name", "")) == self.keys.group),
                None,
            )
            lag = None if mine is None else mine.get("lag")
            rows.append(
                StreamRow(
                    holder=None if holder is None or isinstance(holder, BaseException)
                    else text(holder),
                    ttl_ms=int(ttl) if isinstance(ttl, int) else -2,
                    pending=None if mine is None else int(mine["pending"]),
                    lag=None if lag is None else int(lag),
                    last_delivered="" if mine is None else text(mine["last-delivered-id"]),
                )
            )  # fmt: skip
        return rows

    @translated
    async def sessions(self, names: Sequence[str]) -> list[bool]:
        """Whether each consumer has a live session key."""
        replies = await self._pipelined([("EXISTS", self.keys.session(n)) for n in names])
        return [r == 1 for r in replies]

    async def stopped(self, names: Sequence[str]) -> list[bool]:
        """Whether each consumer's last run stopped cleanly (``Keys.stopped``)."""
        replies = await self._pipelined([("HGET", self.keys.stopped, n) for n in names])
        return [r is not None for r in replies]

    @translated
    async def queue_length(self) -> int:
        return int(await self.client.xlen(self.keys.assignments))

    @translated
    async def active_id(self, stream: str) -> str | None:
        """The unfinished assignment ``add_stream`` queued for ``stream``, if any."""
        value = await self.client.hget(self.keys.active, stream)
        return None if value is None else text(value)

    @translated
    async def indexed_streams(self) -> list[str]:
        """Every data stream name in the active-assignment index (HSCAN, paged)."""
        names = []
        async for name, _ in self.client.hscan_iter(self.keys.active, count=1000):
            names.append(text(name))
        return names

    @translated
    async def group_consumers(self, streams: Sequence[str]) -> list[list[tuple[str, int]]]:
        """(consumer name, pending) of the service's group on each stream ([] where the
        stream or the group is missing)."""
        replies = await self._pipelined(
            [("XINFO", "CONSUMERS", s, self.keys.group) for s in streams]
        )
        out: list[list[tuple[str, int]]] = []
        for reply in replies:
            rows = [] if isinstance(reply, BaseException) or not reply else reply
            parsed = []
            for c in rows:
                pairs = c.items() if isinstance(c, dict) else zip(c[::2], c[1::2], strict=True)
                info = {text(k): v for k, v in pairs}
                parsed.append((text(info["name"]), int(info["pending"])))
            out.append(parsed)
        return out

    # -- dead letters --------------------------------------------------------------

    @translated
    async def dlq_length(self) -> int:
        return int(await self.client.xlen(self.core.dlq))

    @translated
    async def dlq_page(
        self, start: str, end: str, count: int, *, reverse: bool = False
    ) -> list[tuple[str, dict[str, str]]]:
        """One XRANGE (or XREVRANGE from ``start`` down to ``end``) page of the DLQ."""
        if reverse:
            reply = await self.client.xrevrange(self.core.dlq, start, end, count=count)
        else:
            reply = await self.client.xrange(self.core.dlq, start, end, count=count)
        entries, _ = sized_entries(reply)
        return entries

    @translated
    async def delete_dead_letters(self, ids: Sequence[str]) -> int:
        """XDEL ids from the DLQ; returns how many existed."""
        if not ids:
            return 0
        return int(await self.client.xdel(self.core.dlq, *ids))

    @script
    async def replay_assignment(
        self, dead_letter_id: str, stream: str, fields: Sequence[tuple[str, str]]
    ) -> str | None:
        """``replay_assignment.lua``: the new assignment's id; None if the dead letter
        is gone (replayed or purged already)."""
        flat = raw([x for pair in fields for x in pair])
        r = await self.scripts.replay_assignment(
            keys=[self.core.dlq, self.keys.assignments, self.keys.active],
            args=[dead_letter_id, stream, *flat],
        )
        return None if r is None else text(r)

    @script
    async def replay_entries(
        self,
        stream: str,
        letters: Sequence[tuple[str, Sequence[tuple[str, str]]]],
        *,
        run: bool,
        marker_ttl_ms: int,
    ) -> EntryReplay:
        """``replay_entry.lua``: put dead data entries of ``stream`` back on it, in the
        order given, before any end marker the group has not read yet.

        Args:
            stream: the data stream (all of ``letters`` came from it).
            letters: (dead letter id, its entry's fields), oldest first.
            run: the job queued for ``stream`` is a replay run the caller queued for
                these entries (or joins): an end marker follows them, and an end marker
                the group read before is not this job's end.
            marker_ttl_ms: how long each dead letter's replay marker is kept.
        """
        from .._wire import EOS_FIELD, EOS_VALUE

        keys = [
            stream,
            self.keys.lock(stream),
            self.keys.cancel(stream),
            self.keys.ended(stream),
        ]
        args: list[Any] = [
            self.keys.group, marker_ttl_ms, "run" if run else "", EOS_FIELD, EOS_VALUE,
            self.core.max_copy_values,
        ]  # fmt: skip
        for dead_letter_id, fields in letters:
            keys.append(self.keys.replayed(stream, dead_letter_id))
            args += [2 * len(fields), *raw([x for pair in fields for x in pair])]
        r = await self.scripts.replay_entry(keys=keys, args=args)
        return EntryReplay(
            state=text(r[0]),
            closed=int(r[1]) == 1,
            owned=int(r[2]) == 1,
            ids=[text(i) for i in r[3:]],
        )

    @script
    async def replay_group_entry(
        self,
        stream: str,
        dead_letter_id: str,
        fields: Sequence[tuple[str, str]],
        marker_ttl_ms: int,
    ) -> str:
        """``group_replay.lua``: append a shared group's dead entry to ``stream`` again;
        the id appended (by this call, or by an earlier replay of the same dead letter)."""
        r = await self.scripts.group_replay(
            keys=[stream, self.keys.replayed(stream, dead_letter_id)],
            args=[marker_ttl_ms, *raw([x for pair in fields for x in pair])],
        )
        return text(r)

    @script
    async def prune_names(self, stream: str, names: Sequence[str]) -> list[str]:
        """``prune_names.lua`` on ``stream``'s group: the names deleted."""
        if not names:
            return []
        r = await self.scripts.prune_names(keys=[stream], args=[self.keys.group, *names])
        return [text(n) for n in r]
