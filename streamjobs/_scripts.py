"""Lua scripts shipped in ``lua/*.lua``, read once and registered once per client.

redis-py's script objects run EVALSHA and reload the script transparently on
NOSCRIPT (script caches are not replicated, so a promoted replica has none).
"""

from __future__ import annotations

import re
from functools import cache
from importlib.resources import files
from typing import Any

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
)


_INCLUDE = re.compile(r"^--#include (\w+)$", re.MULTILINE)


def _read(name: str) -> str:
    return (files(__package__) / "lua" / f"{name}.lua").read_text(encoding="utf-8")


@cache
def source(name: str) -> str:
    """The text of ``lua/<name>.lua`` (read from the package once per process), each
    line ``--#include x`` replaced by the helpers in ``lua/_x.lua``."""
    return _INCLUDE.sub(lambda m: _read(f"_{m.group(1)}").rstrip("\n"), _read(name))


class Scripts:
    """The registered script objects of one client."""

    def __init__(self, client: Any) -> None:
        self.add = client.register_script(source("add"))
        self.acquire = client.register_script(source("acquire"))
        self.extend = client.register_script(source("extend"))
        self.fence = client.register_script(source("fence"))
        self.claim = client.register_script(source("claim"))
        self.release = client.register_script(source("release"))
        self.finish = client.register_script(source("finish"))
        self.requeue = client.register_script(source("requeue"))
        self.dead_letter = client.register_script(source("dead_letter"))
        self.dlq_add = client.register_script(source("dlq_add"))
        self.lease = client.register_script(source("lease"))
        self.sweep = client.register_script(source("sweep"))
        self.prune_consumers = client.register_script(source("prune_consumers"))
        self.seal = client.register_script(source("seal"))
        self.complete = client.register_script(source("complete"))
        self.cancel = client.register_script(source("cancel"))
        self.signal_cancel = client.register_script(source("signal_cancel"))
        self.skip_unread = client.register_script(source("skip_unread"))
        self.start_job = client.register_script(source("start_job"))
        self.replay_assignment = client.register_script(source("replay_assignment"))
        self.replay_entry = client.register_script(source("replay_entry"))
        self.prune_names = client.register_script(source("prune_names"))
        self.session = client.register_script(source("session"))
        self.next_due = client.register_script(source("next_due"))
