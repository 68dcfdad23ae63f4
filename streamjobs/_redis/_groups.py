"""The commands of shared consumer groups (docs/shared-groups.md): one method per step
of a ``GroupConsumer``, and the only code that knows the group scripts' KEYS and ARGV.

Held by the :class:`~streamjobs._redis.Gateway` as ``gateway.groups``; every command
goes through the gateway's core (the command channel when a consumer runs one), and
every redis-py error leaves here translated.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis.exceptions import NoScriptError

from .._keys import Keys
from ._boundary import (
    Core,
    channelled,
    channelled_command,
    translate,
)
from ._protocol import GroupEntry, GroupRead, Reclaimed
from ._replies import (
    _stream_entries,
    raw_sized_entries,
    sized_entries,
    text,
)

_NO_ENTRIES: list[GroupEntry] = []


class GroupCommands:
    """The group steps of one service on the gateway's client.

    Args:
        core: the gateway whose client, channel, command slots and keys they use.
    """

    def __init__(self, core: Core) -> None:
        self.core = core
        self.keys: Keys = core.keys
        self.group = core.keys.group

    def _entries(self, found: Sequence[Any]) -> list[GroupEntry]:
        decode = raw_sized_entries if self.core.raw_fields else sized_entries
        return decode(found)[0]

    @channelled
    async def join(self, stream: str, member: str, ttl_ms: int, start_id: str) -> None:
        """``member`` joins the group on ``stream`` (the group is created at
        ``start_id`` if it has none), alive for ``ttl_ms`` (``group_join.lua``)."""
        await self.core.scripts.group_join(
            keys=[stream, self.keys.members(stream)], args=[self.group, member, ttl_ms, start_id]
        )

    @channelled
    async def leave(self, stream: str, member: str) -> int:
        """``member`` stops reading ``stream`` (``group_leave.lua``); returns the entries
        left pending under it (reclaimed at once by any live member)."""
        return int(
            await self.core.scripts.group_leave(
                keys=[stream, self.keys.members(stream)], args=[self.group, member]
            )
        )

    @channelled_command
    async def register(self, stream: str) -> None:
        """List ``stream`` among the service's group streams (``streamjobs status``)."""
        key = self.keys.group_streams
        await self.core.command(key, "SADD", key, stream)

    @channelled
    async def ack(self, stream: str, member: str, ids: Sequence[str]) -> bool:
        """Acknowledge ``ids``, fenced by ``member``'s session (``group_ack.lua``);
        False if refused: the member is dead and nothing was acknowledged."""
        return await self._ack(stream, member, ids)

    async def _ack(self, stream: str, member: str, ids: Sequence[str]) -> bool:
        return int(await self.core.scripts.group_ack(*self._ack_call(stream, member, ids))) >= 0

    def _ack_call(
        self, stream: str, member: str, ids: Sequence[str]
    ) -> tuple[list[str], list[str]]:
        """``group_ack.lua``'s KEYS and ARGV (the only place that builds them)."""
        keys = self.keys
        return [stream, keys.members(stream), keys.starts(stream)], [self.group, member, *ids]

    @channelled
    async def ack_and_read(
        self, stream: str, member: str, ids: Sequence[str], count: int
    ) -> GroupRead:
        """One round trip per batch: the acknowledgement of ``ids`` (``group_ack.lua``),
        up to ``count`` new entries (``XREADGROUP >``, not blocking) and the id of the
        stream's newest entry, in one MULTI: when nothing was new, an idle wait for an
        entry after that id misses nothing.

        A MULTI runs every command it queued: if the acknowledgement is refused (the
        member is dead), the read still delivered entries to the dead member; they are
        dropped here (``refused``) and reclaimed by a live one."""
        core, group = self.core, self.group
        commands: list[tuple[Any, ...]] = []
        if ids:
            commands.append(core.scripts.group_ack.command(*self._ack_call(stream, member, ids)))
        commands += [
            ("XREADGROUP", "GROUP", group, member, "COUNT", count, "STREAMS", stream, ">"),
            ("XREVRANGE", stream, "+", "-", "COUNT", 1),
        ]
        replies = await core.transaction(stream, commands)
        if ids:
            acked = replies.pop(0)
            if isinstance(acked, NoScriptError):
                # A restarted or failed-over server: the script call loads it.
                refused = not await self._ack(stream, member, ids)
            elif isinstance(acked, BaseException):
                raise translate(acked, in_script=True) from acked
            else:
                refused = int(acked) < 0
            if refused:
                return GroupRead(True, _NO_ENTRIES, "0-0")
        for reply in replies:
            if isinstance(reply, BaseException):
                raise translate(reply) from reply
        tail = replies[1]
        newest = text(tail[0][0]) if tail else "0-0"
        return GroupRead(False, self._entries(_stream_entries(replies[0])), newest)

    @channelled_command
    async def history(self, stream: str, member: str, count: int) -> list[GroupEntry]:
        """Up to ``count`` entries pending under ``member`` (``XREADGROUP ... 0``):
        claimed from the dead, or delivered by a read whose reply was lost."""
        reply = await self.core.command(
            stream,
            "XREADGROUP", "GROUP", self.group, member, "COUNT", count, "STREAMS", stream, "0",
        )  # fmt: skip
        found = _stream_entries(reply)
        if not found:
            return _NO_ENTRIES
        if all(item[1] is not None for item in found):
            return self._entries(found)
        out: list[GroupEntry] = []
        for item in found:
            if item[1] is None:
                out.append((text(item[0]), None))
            else:
                out.extend(self._entries([item]))
        return out

    @channelled_command
    async def count_start(self, stream: str, entry_id: str) -> int:
        """One more start of a redelivered entry; returns its starts so far (the
        crash-loop count, docs/shared-groups.md#crash-loops)."""
        key = self.keys.starts(stream)
        return int(await self.core.command(key, "HINCRBY", key, entry_id, 1))

    @channelled
    async def beat(self, streams: Sequence[str], members: Sequence[str], ttl_ms: int) -> list[bool]:
        """Renew each member on its stream (``group_beat.lua``; the streams' member
        indexes must share a slot): True renewed, False dead (never revived)."""
        replies = await self.core.scripts.group_beat(
            keys=[self.keys.members(stream) for stream in streams], args=[ttl_ms, *members]
        )
        return [int(ok) == 1 for ok in replies]

    @channelled
    async def reclaim(
        self, stream: str, member: str, count: int, min_idle_ms: int, forget_ms: int
    ) -> Reclaimed:
        """One reclaim pass (``group_reclaim.lua``): claim for ``member`` up to ``count``
        entries of dead or stopped members, and after ``min_idle_ms`` of names with no
        session; forget dead members with nothing pending after ``forget_ms``."""
        reply = await self.core.scripts.group_reclaim(
            keys=[stream, self.keys.members(stream)],
            args=[self.group, member, count, min_idle_ms, forget_ms],
        )
        code = int(reply[0])
        if code == -1:
            return Reclaimed(False, [])
        if code == 1 and reply[1]:
            return Reclaimed(True, [text(i) for i in reply[1]])
        return Reclaimed(True, [])

    @channelled
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
        """Trim ``stream`` below what every group acknowledged, and to the caps
        (``group_trim.lua``), unless a consumer of the service did within ``pace_ms``.
        Returns (entries acknowledged by all, entries dropped by a cap)."""
        reply = await self.core.scripts.group_trim(
            keys=[stream, self.keys.trimmed(stream)],
            args=["1" if acknowledged else "0", max_len, max_age_ms, batch, pace_ms],
        )
        return int(reply[0]), int(reply[1])
