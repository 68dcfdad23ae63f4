"""The gateway: every command of one service on one client, grouped by concern."""

from __future__ import annotations

from typing import Any

import anyio

from .._keys import Keys
from ._assignments import AssignmentCommands
from ._completion import CompletionCommands
from ._groups import GroupCommands
from ._liveness import LivenessCommands
from ._scripts import MAX_COPY_VALUES, Scripts
from ._streams import StreamCommands
from ._writes import ProducerCommands


class Gateway(
    ProducerCommands, AssignmentCommands, StreamCommands, CompletionCommands, LivenessCommands
):
    """Commands of one service on one client. Constructing it does no I/O.

    Args:
        client: ``redis.asyncio.Redis`` or ``RedisCluster``.
        keys: the service's key names.
        dlq: the dead-letter stream; default ``keys.dead_letters``.
        dlq_maxlen: approximate cap of the dead-letter stream; 0 = unbounded.

    Attributes:
        max_copy_values: the most field names and values a script copies field by
            field (``_redis._scripts.MAX_COPY_VALUES``; tests lower it).
    """

    def __init__(self, client: Any, keys: Keys, *, dlq: str | None = None, dlq_maxlen: int = 0):
        self.client = client
        self.keys = keys
        self.limiter: anyio.CapacityLimiter | None = None
        """Bounds the commands in flight (set by a running consumer; None: no bound)."""
        self.dlq = dlq or keys.dead_letters
        self.dlq_maxlen = dlq_maxlen
        self.max_copy_values = MAX_COPY_VALUES
        self.raw_fields = False
        self.scripts = Scripts(client)
        self._is_cluster = hasattr(client, "get_primaries")
        self.last_ok: float | None = None
        """When (``time.monotonic()``) a command of this gateway last got a reply."""
        self.groups = GroupCommands(self)
        """The steps of shared consumer groups (``GroupConsumer``)."""
