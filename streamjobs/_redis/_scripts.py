"""Lua scripts shipped in ``lua/*.lua``, read once and registered once per client."""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import cache
from importlib.resources import files
from typing import TYPE_CHECKING, Any

from redis.exceptions import NoScriptError

if TYPE_CHECKING:
    from ._channel import Channel

MAX_COPY_VALUES = 7_800
"""The most field names and values a script passes to one XADD.

A script copies an entry by building a table of its fields and handing it to XADD
with ``unpack()``, which cannot push more than ``LUAI_MAXCSTACK`` (8,000) values: on
Redis 7.0 an XADD of 3,999 fields (7,998 values) is the largest that works. The scripts
check the size first, and write nothing if it is past this limit: ``requeue.lua``
refuses (``TOOLARGE``), the dead-letter scripts carry the original fields in one JSON
field instead (docs/design.md#wire-format). The margin below 8,000 leaves room for the
values already on the stack."""


_INCLUDE = re.compile(r"^--#include (\w+)$", re.MULTILINE)


def _read(name: str) -> str:
    return (files("streamjobs") / "lua" / f"{name}.lua").read_text(encoding="utf-8")


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

    def command(self, keys: Sequence[Any] = (), args: Sequence[Any] = ()) -> tuple[Any, ...]:
        """The ``EVALSHA`` of this script with ``keys`` and ``args``, as a command to
        queue in a MULTI (a caller that gets NOSCRIPT back loads it and tries again)."""
        return ("EVALSHA", self.sha, len(keys), *keys, *args)

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
    """The scripts of one client, one attribute per ``lua/<name>.lua`` (its name).

    Attributes:
        channel: where the scripts run (``None``: through the client itself).
    """

    channel: Channel | None
    add: Script
    acquire: Script
    extend: Script
    fence: Script
    stray: Script
    claim: Script
    release: Script
    finish: Script
    requeue: Script
    dead_letter_assignment: Script
    dead_letter_entry: Script
    lease: Script
    sweep: Script
    prune_consumers: Script
    seal: Script
    complete: Script
    cancel_queued: Script
    cancel_stream: Script
    skip_unread: Script
    start_job: Script
    replay_assignment: Script
    replay_entry: Script
    prune_names: Script
    session: Script
    next_due: Script
    group_join: Script
    group_beat: Script
    group_ack: Script
    group_reclaim: Script
    group_leave: Script
    group_replay: Script
    group_trim: Script

    def __init__(self, client: Any) -> None:
        self.channel = None
        for name in NAMES:
            setattr(self, name, Script(self, client, name))


NAMES = tuple(name for name in Scripts.__annotations__ if name != "channel")
"""Every script's name: its file ``lua/<name>.lua`` and its attribute of :class:`Scripts`."""
