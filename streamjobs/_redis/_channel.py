"""The command channel: the non-blocking commands of all of a consumer's stream tasks,
coalesced onto one connection per node (docs/design.md#the-command-channel).

A caller queues a command (or a ``MULTI`` block) on the link of the node that holds its
key and waits for its reply. A link's pump takes a connection from the client's pool
when the link gets busy, writes everything queued in one write, reads the replies in
order and answers each caller, then writes what was queued meanwhile, and hands the
connection back once nothing is left. So however many streams act at once, each node
sees one connection and one write per round trip instead of one per command.

Bounds: one batch carries at most :data:`MAX_BATCH_COMMANDS` commands and, past its
first call, :data:`MAX_BATCH_BYTES` of arguments; the rest wait for the next batch.
Blocking reads, and reads whose reply may be large, never come here (the gateway sends
them on connections of their own), so one large reply does not hold up the others.

Failures: an error reply fails its own caller only. A failed write or read (a dropped
connection, a timeout) fails the batch in flight, whose commands may or may not have
run, exactly as a lost reply on any connection; the connection is closed, and what is
still queued goes out on a new one. Every step the runtime sends is safe to retry by
design. A caller cancelled before its command is written leaves the queue; one
cancelled after it was written has its reply read and dropped, so the connection stays
in step. On a cluster, a command answered ``MOVED`` or ``ASK`` (its slot moved) is sent
again through the user's cluster client, which follows the redirection and refreshes
the slot table that routes the next ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from redis import exceptions as rex

from ..exceptions import RedisUnavailable

MAX_BATCH_COMMANDS = 512
"""The most commands one write of a link carries."""
MAX_BATCH_BYTES = 1024 * 1024
"""The most argument bytes one write carries beyond its first call (a larger call goes
alone)."""

LARGE_REPLY_BYTES = 256 * 1024
"""A read whose entries may be larger than this in all goes on a connection of its own."""

MAX_IN_FLIGHT = 256
"""The most gateway steps that use one channel at once (``Channel.room``); more wait
their turn before building their commands. It bounds what a burst costs in memory:
10,000 streams starting at once would otherwise hold every step's arguments, packed
command and reply at the same moment, and the process keeps that peak."""

Command = tuple[Any, ...]


def pack(commands: Sequence[Command], encoding: str = "utf-8", errors: str = "strict") -> bytes:
    """``commands`` in the Redis protocol (RESP), as redis-py's encoder would write them:
    ``str`` in the client's encoding, ``int`` and ``float`` by ``repr``, ``bytes`` as
    they are; ``bool`` and anything else refused (``DataError``)."""
    parts: list[bytes] = []
    append = parts.append
    for command in commands:
        append(b"*%d\r\n" % len(command))
        for arg in command:
            kind = type(arg)
            if kind is str:
                arg = arg.encode(encoding, errors)
            elif kind is not bytes:
                if kind is bool or not isinstance(
                    arg, int | float | bytes | bytearray | memoryview
                ):
                    raise rex.DataError(
                        f"Invalid input of type: {kind.__name__!r}. "
                        "Convert to a bytes, string, int or float first."
                    )
                arg = repr(arg).encode() if isinstance(arg, int | float) else bytes(arg)
            append(b"$%d\r\n%b\r\n" % (len(arg), arg))
    return b"".join(parts)


_LOST = (rex.ConnectionError, rex.TimeoutError, OSError)
"""What a link raises when its node cannot be reached."""


def release_to_node(node: Any, connection: Any) -> None:
    """Give a connection back to a cluster node's pool: ``ClusterNode.release`` where
    it exists (redis-py 6+); redis-py 5 has no such method, and takes connections
    back through its free queue."""
    release = getattr(node, "release", None)
    if release is not None:
        release(connection)
    else:
        node._free.append(connection)


def is_redirect(exc: BaseException) -> bool:
    """The reply says the key's slot lives elsewhere (``MOVED`` or ``ASK``)."""
    return isinstance(exc, rex.AskError) or (  # MovedError is an AskError
        isinstance(exc, rex.ResponseError) and str(exc).startswith(("MOVED", "ASK "))
    )


class _Call:
    """One caller's command, or ``MULTI`` block, and the future its reply goes to."""

    __slots__ = ("future", "packed", "replies", "transaction")

    def __init__(self, packed: bytes, replies: int, transaction: bool) -> None:
        self.packed = packed
        self.replies = replies
        self.transaction = transaction
        self.future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    def fail(self, exc: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(exc)


class _Link:
    """One node: its queue, and the pump that drains it over one connection."""

    def __init__(
        self,
        take: Callable[[], Any],
        give: Callable[[Any], Any],
        on_batch: Callable[[int], None],
    ) -> None:
        self.take = take
        self.give = give
        self._on_batch = on_batch
        self._queue: deque[_Call] = deque()
        self._pump: asyncio.Task[None] | None = None

    async def submit(self, call: _Call) -> Any:
        self._queue.append(call)
        if self._pump is None:
            # The pump's first step runs in the next turn of the event loop: everything
            # queued in this turn goes in its first write.
            self._pump = asyncio.get_running_loop().create_task(self._drain())
        return await call.future

    def _next_batch(self) -> list[_Call]:
        batch: list[_Call] = []
        commands = size = 0
        queue = self._queue
        while queue and commands < MAX_BATCH_COMMANDS:
            call = queue[0]
            if call.future.done():  # its caller was cancelled before it was written
                queue.popleft()
                continue
            if batch and size + len(call.packed) > MAX_BATCH_BYTES:
                break
            queue.popleft()
            batch.append(call)
            commands += call.replies
            size += len(call.packed)
        return batch

    async def _drain(self) -> None:
        connection: Any = None
        try:
            connection = await self.take()
            while True:
                batch = self._next_batch()
                if not batch:
                    # Let the callers just answered queue their next commands, so that
                    # they share this connection's next write instead of a new pump's.
                    await asyncio.sleep(0)
                    batch = self._next_batch()
                    if not batch:
                        return
                try:
                    await self._send(connection, batch)
                except Exception:
                    continue  # the next batch reconnects
        except BaseException as exc:
            failure = exc if isinstance(exc, Exception) else RedisUnavailable("the channel stopped")
            while self._queue:
                self._queue.popleft().fail(failure)
            if not isinstance(exc, Exception):
                raise
        finally:
            self._pump = None
            if connection is not None:
                await asyncio.shield(self.give(connection))

    async def _send(self, connection: Any, batch: list[_Call]) -> None:
        self._on_batch(sum(call.replies for call in batch))
        pending = iter(batch)
        try:
            await connection.send_packed_command([call.packed for call in batch])
            for call in pending:
                call_reply = await self._reply(connection, call)
                if not call.future.done():
                    if isinstance(call_reply, _Failed):
                        call.future.set_exception(call_reply.error)
                    else:
                        call.future.set_result(call_reply)
        except BaseException as exc:
            # The connection is out of step (replies left unread): close it; the
            # calls still waiting may or may not have run.
            await asyncio.shield(connection.disconnect(nowait=True))
            failure = exc if isinstance(exc, Exception) else RedisUnavailable("the channel stopped")
            for call in batch:
                call.fail(failure)
            raise

    @staticmethod
    async def _reply(connection: Any, call: _Call) -> Any:
        if not call.transaction:
            try:
                return await connection.read_response()
            except rex.ResponseError as exc:
                return _Failed(exc)
        # MULTI's OK, a QUEUED per command, then EXEC's reply: the first error reply
        # (a command refused when queued makes EXEC fail too) is the call's answer.
        error: rex.ResponseError | None = None
        reply: Any = None
        for _ in range(call.replies):
            try:
                reply = await connection.read_response()
            except rex.ResponseError as exc:
                error = error or exc
        return _Failed(error) if error is not None else reply


class _Failed:
    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


class Channel:
    """Coalesces commands of many tasks onto one connection per node of ``client``.

    Constructing it does no I/O. Replies are unparsed (no redis-py response callbacks),
    decoded as the client's connections decode them.

    Attributes:
        batches: writes made so far.
        commands: commands written so far (``MULTI`` and ``EXEC`` included).
    """

    def __init__(self, client: Any) -> None:
        self.client = client
        self._cluster = hasattr(client, "get_node_from_key")
        self._links: dict[str, _Link] = {}
        encoder = client.get_encoder()
        self._encoding: str = encoder.encoding
        self._errors: str = encoder.encoding_errors
        self.room = asyncio.Semaphore(MAX_IN_FLIGHT)
        """Held by each gateway step on the channel (``_boundary.channelled``)."""
        self.batches = 0
        self.commands = 0
        self._refreshed_at = -math.inf

    def _count(self, commands: int) -> None:
        self.batches += 1
        self.commands += commands

    def _link(self, key: str) -> _Link:
        if not self._cluster:
            link = self._links.get("")
            if link is None:
                pool = self.client.connection_pool

                async def take() -> Any:
                    try:
                        return await pool.get_connection()
                    except TypeError:  # redis-py before 5.3 wants a command name
                        return await pool.get_connection("MULTI")

                link = self._links[""] = _Link(take, pool.release, self._count)
            return link
        node = self.client.get_node_from_key(key)
        link = self._links.get(node.name)
        if link is None:
            name = node.name
            client = self.client

            async def take_node() -> Any:
                current = client.get_node(node_name=name) or node
                connection = current.acquire_connection()
                connection._streamjobs_node = current
                return connection

            async def give_node(connection: Any) -> None:
                release_to_node(connection._streamjobs_node, connection)

            link = self._links[name] = _Link(take_node, give_node, self._count)
        return link

    async def _lost_node(self) -> None:
        """A cluster node's connection failed (a primary killed): refresh the client's
        slot table, at most once a second, so that the next steps go to whichever
        replica took its slots. redis-py's own routed commands do this themselves; the
        channel's links route by the table and would keep dialling the dead node."""
        now = time.monotonic()
        if not self._cluster or now - self._refreshed_at < 1.0:
            return
        self._refreshed_at = now
        with contextlib.suppress(Exception):  # the next failure tries again
            await self.client.nodes_manager.initialize()

    async def call(self, key: str, *command: Any) -> Any:
        """Run one command on the node of ``key``'s slot; its reply, or its error reply
        raised (redis-py's exception classes, untranslated)."""
        try:
            packed = pack((command,), self._encoding, self._errors)
            return await self._link(key).submit(_Call(packed, 1, False))
        except _LOST:
            await self._lost_node()
            raise
        except rex.ResponseError as exc:
            if not (self._cluster and is_redirect(exc)):
                raise
        return await self.client.execute_command(*command)

    async def transaction(self, key: str, commands: Sequence[Command]) -> Any:
        """MULTI, ``commands`` (all in ``key``'s slot), EXEC: EXEC's reply, unparsed (a
        failed command's error in its place), or the first error reply raised."""
        for attempt in range(2):
            try:
                packed = pack([("MULTI",), *commands, ("EXEC",)], self._encoding, self._errors)
                return await self._link(key).submit(_Call(packed, len(commands) + 2, True))
            except _LOST:
                await self._lost_node()
                raise
            except rex.ResponseError as exc:
                if attempt or not (self._cluster and is_redirect(exc)):
                    raise
            # Nothing ran (the block was refused where the slot no longer lives): a
            # command through the cluster client follows the redirection and refreshes
            # the slot table, then the block goes again.
            await self.client.exists(key)
        raise AssertionError("unreachable")
