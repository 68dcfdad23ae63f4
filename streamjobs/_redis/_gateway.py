"""The gateway: every command of one service on one client, in command groups it holds
(docs/design.md#module-map): producer writes, the assignment stream, data streams and
their locks, the end of a stream's lock, liveness, shared groups and the operator
tools. The gateway itself is their core: the client, the command channel and the
command slots, and the raw transaction."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import anyio

from .._keys import Keys
from ._assignments import AssignmentCommands
from ._boundary import command_slot, exec_replies, pool_transaction
from ._channel import Channel
from ._completion import CompletionCommands
from ._groups import GroupCommands
from ._liveness import LivenessCommands
from ._operator import OperatorCommands
from ._scripts import MAX_COPY_VALUES, Scripts
from ._streams import StreamCommands
from ._writes import ProducerCommands


class Gateway:
    """Commands of one service on one client. Constructing it does no I/O.

    Args:
        client: ``redis.asyncio.Redis`` or ``RedisCluster``.
        keys: the service's key names.
        dlq: the dead-letter stream; default ``keys.dead_letters``.
        dlq_maxlen: approximate cap of the dead-letter stream; 0 = unbounded.

    Attributes:
        max_copy_values: the most field names and values a script copies field by
            field (``_redis._scripts.MAX_COPY_VALUES``; tests lower it).
        writes, assignments, streams, completion, liveness, groups, operator: the
            command groups (``_redis/_writes.py``, ``_assignments.py``, ...).
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
        self.is_cluster = hasattr(client, "get_primaries")
        self.last_ok: float | None = None
        """When (``time.monotonic()``) a command of this gateway last got a reply."""
        self.writes = ProducerCommands(self)
        self.assignments = AssignmentCommands(self)
        self.streams = StreamCommands(self)
        self.completion = CompletionCommands(self)
        self.liveness = LivenessCommands(self)
        self.groups = GroupCommands(self)
        self.operator = OperatorCommands(self)

    @property
    def channel(self) -> Channel | None:
        """The command channel (docs/design.md#the-command-channel), set by a running
        consumer; ``None``: every command goes through the client itself."""
        return self.scripts.channel

    def slot(self) -> contextlib.AbstractAsyncContextManager[None]:
        """Hold one of the consumer's command slots (one the task holds already is
        reused), for a command sent outside the channel from a channelled method."""
        return command_slot(self.limiter)

    async def command(self, key: str, *command: Any, large: bool = False) -> Any:
        """One command on ``key``'s slot: on the channel unless its reply may be large
        (then on a pool connection, in a command slot). The reply may be unparsed."""
        channel = self.channel
        if channel is not None and not large:
            return await channel.call(key, *command)
        async with self.slot():
            if self.is_cluster:
                # Sent to the node of key's slot: a command that names no key (SCRIPT
                # LOAD) could not be routed otherwise.
                node = self.client.get_node_from_key(key)
                return await self.client.execute_command(*command, target_nodes=node)
            return await self.client.execute_command(*command)

    async def transaction(
        self, key: str, commands: Sequence[tuple[Any, ...]], *, large: bool = False
    ) -> list[Any]:
        """Run ``commands`` (all on ``key``'s slot) in one MULTI/EXEC; error replies are
        returned in place, as exceptions.

        On the command channel when there is one, unless the reply may be ``large``.
        Otherwise it goes raw over one connection of the pool (``pool_transaction``):
        redis-py's cluster pipeline has no usable transactions across the versions we
        support, and on a standalone server its pipeline's per-command parsing and
        bookkeeping cost more client time than the batch's own entries. Replies are
        then unparsed (what ``sized_entries`` reads).
        """
        channel = self.channel
        if channel is not None and not large:
            return exec_replies(await channel.transaction(key, commands))
        async with self.slot():
            return await pool_transaction(self.client, key, commands)
