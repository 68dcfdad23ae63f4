"""An in-memory fake of :class:`streamjobs._redis._groups.GroupCommands`: the shared
groups of a ``GroupConsumer``, over a :class:`~tests.fakes.gateway.FakeGateway`'s data
streams (``FakeGateway.groups``).

Each method gives the observable semantics of its script (``streamjobs/lua/group_*.lua``)
in one step between two awaits, as a script runs atomically, with the gateway's faults
and gates (method names ``groups.<method>``, e.g. ``fake.fail("groups.ack")``):

* a stream's consumer group: its last-delivered id and pending list (entry id ->
  member, delivery time, count);
* the stream's member index: member -> deadline (fake clock, ms); a member past its
  deadline is dead for good, one that left has a negative score (-when it left);
* the restart counters of redelivered entries, the list of group streams, and the
  trimming pace keys.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from streamjobs._redis._protocol import GroupEntry, GroupRead, Reclaimed
from streamjobs.exceptions import NoSuchGroup
from tests.fakes.gateway import FakeGateway, _Delivery, _Group, _Stream, parse_id

GROUP_METHODS = frozenset(
    f"groups.{name}"
    for name in (
        "join",
        "leave",
        "register",
        "ack",
        "ack_and_read",
        "history",
        "count_start",
        "beat",
        "reclaim",
        "trim",
    )
)
"""The fault and gate names of the group steps (``FakeGateway.fail("groups.ack")``)."""


class FakeGroups:
    """The group steps of one service, in memory (see the module docstring)."""

    def __init__(self, gateway: FakeGateway) -> None:
        self._gw = gateway
        self.members: dict[str, dict[str, int]] = {}
        """Per stream: member -> deadline (ms, fake clock); negative: left at -score."""
        self.starts: dict[str, dict[str, int]] = {}
        """Per stream: entry id -> starts counted after redeliveries."""
        self.registered: set[str] = set()
        self._paced: dict[str, int] = {}  # stream -> until when (ms) a trim is skipped

    # -- helpers ------------------------------------------------------------------------

    def _now(self) -> int:
        return self._gw.clock()

    def _alive(self, stream: str, member: str) -> bool:
        return self.members.get(stream, {}).get(member, -1) > self._now()

    def _group(self, stream: str) -> tuple[_Stream, _Group]:
        s = self._gw._data_stream(stream)
        if s is None or s.group is None:
            raise NoSuchGroup(f"NOGROUP no group on {stream!r} (fake)")
        return s, s.group

    def pending_under(self, stream: str, member: str) -> list[str]:
        """Ids pending under ``member`` (for assertions)."""
        s = self._gw._data_stream(stream)
        if s is None or s.group is None:
            return []
        return sorted((i for i, d in s.group.pel.items() if d.consumer == member), key=_order)

    def pending(self, stream: str) -> int:
        s = self._gw._data_stream(stream)
        return 0 if s is None or s.group is None else len(s.group.pel)

    async def _step(self, method: str, *args: Any) -> None:
        await self._gw._enter(f"groups.{method}", *args)

    async def _done(self, method: str) -> None:
        await self._gw._leave(f"groups.{method}")

    # -- the steps ----------------------------------------------------------------------

    async def join(self, stream: str, member: str, ttl_ms: int, start_id: str) -> None:
        await self._step("join", stream, member)
        s = self._gw._data_stream(stream)
        if s is None:
            s = self._gw._data[stream] = _Stream()
        if s.group is None:
            s.group = _Group(last_delivered=s.last_id if start_id == "$" else (0, 0))
        self.members.setdefault(stream, {})[member] = self._now() + ttl_ms
        await self._done("join")

    async def leave(self, stream: str, member: str) -> int:
        await self._step("leave", stream, member)
        index = self.members.setdefault(stream, {})
        if member in index:
            index[member] = -self._now()
        left = len(self.pending_under(stream, member))
        await self._done("leave")
        return left

    async def register(self, stream: str) -> None:
        await self._step("register", stream)
        self.registered.add(stream)
        await self._done("register")

    def _ack(self, stream: str, member: str, ids: Sequence[str]) -> bool:
        if not self._alive(stream, member):
            return False
        s = self._gw._data_stream(stream)
        if s is not None and s.group is not None:
            for entry_id in ids:
                s.group.pel.pop(entry_id, None)
                self.starts.get(stream, {}).pop(entry_id, None)
        return True

    async def ack(self, stream: str, member: str, ids: Sequence[str]) -> bool:
        await self._step("ack", stream, member, tuple(ids))
        acked = self._ack(stream, member, ids)
        await self._done("ack")
        return acked

    async def ack_and_read(
        self, stream: str, member: str, ids: Sequence[str], count: int
    ) -> GroupRead:
        await self._step("ack_and_read", stream, member, tuple(ids))
        refused = bool(ids) and not self._ack(stream, member, ids)
        s, group = self._group(stream)
        delivered: list[GroupEntry] = []
        for entry_id, fields in s.entries.items():
            if len(delivered) >= count:
                break
            if parse_id(entry_id) <= group.last_delivered:
                continue
            group.last_delivered = parse_id(entry_id)
            group.pel[entry_id] = _Delivery(member, self._now())
            delivered.append((entry_id, self._fields(fields)))
        await self._done("ack_and_read")
        if refused:  # the read still delivered, to the dead member: another's to reclaim
            return GroupRead(True, [], "0-0")
        return GroupRead(False, delivered, s.top())

    def _fields(self, fields: dict[str, bytes | str]) -> dict[Any, Any]:
        if self._gw.raw_fields:
            return {_raw(k): _raw(v) for k, v in fields.items()}
        return {_text(k): _text(v) for k, v in fields.items()}

    async def history(self, stream: str, member: str, count: int) -> list[GroupEntry]:
        await self._step("history", stream, member)
        s, _ = self._group(stream)
        out: list[GroupEntry] = []
        for entry_id in self.pending_under(stream, member)[:count]:
            fields = s.entries.get(entry_id)
            out.append((entry_id, None if fields is None else self._fields(fields)))
        await self._done("history")
        return out

    async def count_start(self, stream: str, entry_id: str) -> int:
        await self._step("count_start", stream, entry_id)
        counts = self.starts.setdefault(stream, {})
        counts[entry_id] = counts.get(entry_id, 0) + 1
        await self._done("count_start")
        return counts[entry_id]

    async def beat(self, streams: Sequence[str], members: Sequence[str], ttl_ms: int) -> list[bool]:
        await self._step("beat", tuple(streams), tuple(members))
        out = []
        for stream, member in zip(streams, members, strict=True):
            alive = self._alive(stream, member)
            if alive:
                self.members[stream][member] = self._now() + ttl_ms
            out.append(alive)
        await self._done("beat")
        return out

    async def reclaim(
        self, stream: str, member: str, count: int, min_idle_ms: int, forget_ms: int
    ) -> Reclaimed:
        await self._step("reclaim", stream, member)
        if not self._alive(stream, member):
            await self._done("reclaim")
            return Reclaimed(False, [])
        s = self._gw._data_stream(stream)
        claimed: list[str] = []
        if s is not None and s.group is not None:
            now = self._now()
            index = self.members.get(stream, {})
            for entry_id, d in sorted(s.group.pel.items(), key=lambda item: _order(item[0])):
                if len(claimed) >= count:
                    break
                if d.consumer == member:
                    continue
                score = index.get(d.consumer)
                dead = score is not None and (score < 0 or score <= now)
                unknown = score is None and min_idle_ms > 0 and now - d.at_ms >= min_idle_ms
                if not (dead or unknown):
                    continue
                if entry_id not in s.entries:
                    del s.group.pel[entry_id]  # gone from the stream: dropped by the claim
                    continue
                d.consumer, d.at_ms = member, now
                claimed.append(entry_id)
            for name, score in list(index.items()):  # forget the long dead with nothing held
                gone_at = -score if score < 0 else score
                dead_long = (score < 0 or score <= now) and now - gone_at >= forget_ms
                if dead_long and not self.pending_under(stream, name):
                    del index[name]
        await self._done("reclaim")
        return Reclaimed(True, claimed)

    async def trim(
        self,
        stream: str,
        *,
        acknowledged: bool,
        max_len: int,
        max_age_ms: int,
        batch: int,
        pace_ms: int,
    ) -> tuple[int, int]:
        await self._step("trim", stream)
        s = self._gw._data_stream(stream)
        now = self._now()
        if s is None or self._paced.get(stream, 0) > now:
            await self._done("trim")
            return 0, 0
        self._paced[stream] = now + pace_ms
        removed = dropped = 0
        group = s.group
        if group is not None and acknowledged:
            # Below the oldest pending entry, or past the last delivered one: every
            # entry there was delivered and acknowledged.
            oldest = min((parse_id(i) for i in group.pel), default=None)
            ms, seq = group.last_delivered
            floor = oldest if oldest is not None else (ms, seq + 1)
            for entry_id in list(s.entries):
                if removed >= batch or parse_id(entry_id) >= floor:
                    break
                del s.entries[entry_id]
                removed += 1
        while max_len and len(s.entries) > max_len and removed + dropped < batch:
            del s.entries[next(iter(s.entries))]
            dropped += 1
        await self._done("trim")
        return removed, dropped


def _order(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else value


def _raw(value: bytes | str) -> bytes:
    return value if isinstance(value, bytes) else value.encode("utf-8", "surrogateescape")
