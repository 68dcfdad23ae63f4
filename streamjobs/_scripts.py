"""Lua scripts shipped in ``lua/*.lua``, read once and registered once per client."""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import cache
from importlib.resources import files
from typing import TYPE_CHECKING, Any

from redis.exceptions import NoScriptError

if TYPE_CHECKING:
    from ._redis._channel import Channel

MAX_COPY_VALUES = 7_800
"""The most field names and values a script passes to one XADD.

A script copies an entry by building a table of its fields and handing it to XADD
with ``unpack()``, which cannot push more than ``LUAI_MAXCSTACK`` (8,000) values: on
Redis 7.0 an XADD of 3,999 fields (7,998 values) is the largest that works. The scripts
check the size first, and write nothing if it is past this limit: ``requeue.lua``
refuses (``TOOLARGE``), the dead-letter scripts carry the original fields in one JSON
field instead (docs/design.md#wire-format). The margin below 8,000 leaves room for the
values already on the stack."""

NAMES = (
    "add",
    "acquire",
    "extend",
    "fence",
    "stray",
    "claim",
    "release",
    "finish",
    "requeue",
    "dead_letter",
    "dlq_add",
    "lease",
    "sweep",
    "prune_consumers",
    "seal",
    "complete",
    "cancel",
    "signal_cancel",
    "skip_unread",
    "start_job",
    "replay_assignment",
    "replay_entry",
    "prune_names",
    "session",
    "next_due",
    "group_join",
    "group_beat",
    "group_ack",
    "group_reclaim",
    "group_leave",
    "group_replay",
    "group_trim",
)


_INCLUDE = re.compile(r"^--#include (\w+)$", re.MULTILINE)


def _read(name: str) -> str:
    return (files(__package__) / "lua" / f"{name}.lua").read_text(encoding="utf-8")


@cache
def source(name: str) -> str:
    """The text of ``lua/<name>.lua`` (read from the package once per process), each
    line ``--#include x`` replaced by the helpers in ``lua/_x.lua``."""
    return _INCLUDE.sub(lambda m: _read(f"_{m.group(1)}").rstrip("\n"), _read(name))


class Script:
    """One script, run with ``EVALSHA``: on the command channel when its owner has one
    (docs/design.md#the-command-channel), else through the client (redis-py's script
    object). Either way a server without it (restarted, or a promoted replica: script
    caches are not replicated) gets it loaded and the call goes again."""

    __slots__ = ("_client_script", "_owner", "script", "sha")

    def __init__(self, owner: Scripts, client: Any, name: str) -> None:
        self._owner = owner
        self._client_script = client.register_script(source(name))
        self.script: str = source(name)
        self.sha: str = self._client_script.sha

    async def __call__(self, keys: Sequence[Any] = (), args: Sequence[Any] = ()) -> Any:
        channel = self._owner.channel
        if channel is None or not keys:
            return await self._client_script(keys=list(keys), args=list(args))
        key = keys[0]
        try:
            return await channel.call(key, "EVALSHA", self.sha, len(keys), *keys, *args)
        except NoScriptError:
            await channel.call(key, "SCRIPT", "LOAD", self.script)
            return await channel.call(key, "EVALSHA", self.sha, len(keys), *keys, *args)


class Scripts:
    """The scripts of one client.

    Attributes:
        channel: where the scripts run (``None``: through the client itself).
    """

    def __init__(self, client: Any) -> None:
        self.channel: Channel | None = None
        self.add = Script(self, client, "add")
        self.acquire = Script(self, client, "acquire")
        self.extend = Script(self, client, "extend")
        self.fence = Script(self, client, "fence")
        self.stray = Script(self, client, "stray")
        self.claim = Script(self, client, "claim")
        self.release = Script(self, client, "release")
        self.finish = Script(self, client, "finish")
        self.requeue = Script(self, client, "requeue")
        self.dead_letter = Script(self, client, "dead_letter")
        self.dlq_add = Script(self, client, "dlq_add")
        self.lease = Script(self, client, "lease")
        self.sweep = Script(self, client, "sweep")
        self.prune_consumers = Script(self, client, "prune_consumers")
        self.seal = Script(self, client, "seal")
        self.complete = Script(self, client, "complete")
        self.cancel = Script(self, client, "cancel")
        self.signal_cancel = Script(self, client, "signal_cancel")
        self.skip_unread = Script(self, client, "skip_unread")
        self.start_job = Script(self, client, "start_job")
        self.replay_assignment = Script(self, client, "replay_assignment")
        self.replay_entry = Script(self, client, "replay_entry")
        self.prune_names = Script(self, client, "prune_names")
        self.session = Script(self, client, "session")
        self.next_due = Script(self, client, "next_due")
        self.group_join = Script(self, client, "group_join")
        self.group_beat = Script(self, client, "group_beat")
        self.group_ack = Script(self, client, "group_ack")
        self.group_reclaim = Script(self, client, "group_reclaim")
        self.group_leave = Script(self, client, "group_leave")
        self.group_replay = Script(self, client, "group_replay")
        self.group_trim = Script(self, client, "group_trim")
