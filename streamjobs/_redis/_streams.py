"""Locks and data streams: the leases, acquiring, extending, fenced reads and claims
(sealing and releasing: :mod:`._completion`)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import anyio
from redis import exceptions as rex

from .._keys import Keys
from ..exceptions import (
    RedisUnavailable,
)
from ._boundary import (
    ACQUIRED,
    ACQUIRED_ENDED,
    Core,
    blocking,
    channelled,
    script,
    translate,
)
from ._channel import LARGE_REPLY_BYTES
from ._replies import (
    NOT_OWNED,
    DataEntry,
    ReadReply,
    _stream_entries,
    id_order,
    raw_sized_entries,
    sized_entries,
    text,
)
from ._scripts import Scripts

log = logging.getLogger(__name__)

_CLAIM_SPAN_SLACK = 100
"""Entries acked between claimed ones that one XRANGE over the claimed span may carry."""


class StreamCommands:
    """Locks and data streams: the leases, acquiring, extending, fenced reads and claims."""

    def __init__(self, core: Core) -> None:
        self.core = core
        self.client: Any = core.client
        self.keys: Keys = core.keys
        self.scripts: Scripts = core.scripts

    def _entries(self, raw: Sequence[Any] | None) -> tuple[list[DataEntry], int]:
        """A data read's entries as ``handle()`` gets them: decoded, or in bytes mode
        (``raw_fields``) undecoded; and the largest one's size in bytes."""
        if self.core.raw_fields:
            return raw_sized_entries(raw)
        return sized_entries(raw)

    # -- locks and data streams ----------------------------------------------------

    @channelled
    async def acquire(
        self, stream: str, token: str, ttl_ms: int, replace: str = "", job: str = ""
    ) -> int:
        """Take ``stream``'s lock for ``token``: if it is free, or if it holds ``replace``
        (a dead session's token, read by the caller: docs/design.md#liveness).

        Returns:
            :data:`NOT_ACQUIRED` (someone else holds it), :data:`ACQUIRED`, or
            :data:`ACQUIRED_ENDED`: taken, but job ``job`` already ended early (its owner
            died before completing the assignment): only complete it.
        """
        return int(await self.scripts.acquire(*self._acquire(stream, token, ttl_ms, replace, job)))

    def _acquire(
        self, stream: str, token: str, ttl_ms: int, replace: str, job: str
    ) -> tuple[list[str], list[Any]]:
        """``acquire.lua``'s KEYS and ARGV (the only place that builds them)."""
        keys = self.keys
        return (
            [keys.lock(stream), stream, keys.ended(stream)],
            [token, ttl_ms, keys.group, replace, job],
        )

    def _fence(self, stream: str, token: str, ack: Sequence[str]) -> tuple[list[str], list[Any]]:
        """``fence.lua``'s KEYS and ARGV (the only place that builds them)."""
        keys = self.keys
        return [keys.lock(stream), stream, keys.cancel(stream)], [token, keys.group, *ack]

    @channelled
    async def acquire_and_read(
        self, stream: str, token: str, ttl_ms: int, job: str, consumer: str, count: int
    ) -> tuple[int, ReadReply | None]:
        """:meth:`acquire` (a free lock only) and the stream's first :meth:`fenced_read`
        in one MULTI in the stream's slot: one round trip where there were two.

        Returns ``(taken, first read)``. The read is None unless the lock was taken
        (:data:`ACQUIRED`) and the read is the plain case: nothing was pending and it
        returned. Otherwise the caller reads by itself. A MULTI runs every command it
        queued: when the lock was not taken (or its job had ended), its XREADGROUP
        still delivered entries to this consumer. They stay pending with it, and the
        stream's owner claims them, in order, before reading further: the path of a
        stalled owner's read behind its own failed fence (docs/recovery.md).
        """
        group = self.keys.group
        acquire, fence = self.scripts.acquire, self.scripts.fence
        commands: list[tuple[Any, ...]] = [
            ("GET", self.keys.ended(stream)),  # the ended-job marker as the acquire finds it
            acquire.command(*self._acquire(stream, token, ttl_ms, "", job)),
            fence.command(*self._fence(stream, token, ())),
            ("XREADGROUP", "GROUP", group, consumer, "COUNT", count, "STREAMS", stream, ">"),
        ]
        for attempt in range(2):
            marker, taken, fenced, read = await self.core.transaction(stream, commands)
            missing = [
                lua
                for lua, reply in ((acquire, taken), (fence, fenced))
                if isinstance(reply, rex.NoScriptError)
            ]
            if not missing or attempt:
                break
            # A restarted or promoted server has no scripts: load them and go again.
            for lua in missing:
                await self.core.command(stream, "SCRIPT", "LOAD", lua.script)
        if isinstance(taken, BaseException):
            raise translate(taken, in_script=True) from taken
        if (
            int(taken) == ACQUIRED_ENDED
            and isinstance(marker, bytes)
            and marker.startswith(b"e ")
            and not isinstance(read, BaseException)
        ):
            # This job ended early: what the read delivered was appended after its end
            # and belongs to it (docs/design.md#job-identity). Left pending with us, it
            # would wait for a next job of the name, or the stream's expiry; we hold
            # the lock, so it is skipped now, as the next job's start would skip it.
            skipped = [entry_id for entry_id, _ in self._entries(_stream_entries(read))[0]]
            if skipped:
                await self.core.command(stream, "XACK", stream, group, *skipped)
        if int(taken) != ACQUIRED or isinstance(fenced, BaseException) or int(fenced[0]) != 1:
            return int(taken), None
        if len(fenced) > 3 and fenced[3] is not None and fenced[3] is not False:
            return ACQUIRED, ReadReply(True, "0-0", [], cancelled=text(fenced[3]))
        if int(fenced[2]) != 0 or isinstance(read, BaseException):
            return ACQUIRED, None  # pending entries: the caller's read claims them
        batch, largest = self._entries(_stream_entries(read))
        return ACQUIRED, ReadReply(True, "0-0" if batch else text(fenced[1]), batch, largest)

    @script
    async def extend_many(self, locks: Sequence[tuple[str, str]], ttl_ms: int) -> list[bool | None]:
        """Extend each (stream, token) lock (compare-and-set on the token).

        Returns, per lock: True extended, False gone or someone else's, None unknown
        (its node could not be reached). On a standalone server it is one pipelined
        round trip and all or nothing (it raises). On a cluster the locks are grouped
        by node and each node is asked concurrently, so one unreachable primary
        (mid-failover) does not keep the locks on the others from being extended.
        """
        if not self.core.is_cluster:
            # Plain EVALSHAs: redis-py's pipelined script objects would first send
            # SCRIPT EXISTS, a permission the consumer does not otherwise need.
            extend = self.scripts.extend
            for attempt in range(2):
                async with self.client.pipeline(transaction=False) as pipe:
                    for stream, token in locks:
                        pipe.execute_command(
                            "EVALSHA", extend.sha, 1, self.keys.lock(stream), token, ttl_ms
                        )
                    replies = await pipe.execute(raise_on_error=False)
                if attempt or not any(isinstance(r, rex.NoScriptError) for r in replies):
                    break
                await self.client.script_load(extend.script)  # a restarted server
            for r in replies:
                if isinstance(r, BaseException):
                    raise translate(r, in_script=True) from r
            return [int(r) == 1 for r in replies]
        by_node: dict[str, list[int]] = {}
        for i, (stream, _) in enumerate(locks):
            node = self.client.get_node_from_key(self.keys.lock(stream))
            by_node.setdefault(node.name, []).append(i)
        out: list[bool | None] = [None] * len(locks)

        async def extend_on_node(indexes: list[int]) -> None:
            for i in indexes:
                stream, token = locks[i]
                try:
                    r = await self.scripts.extend(
                        keys=[self.keys.lock(stream)], args=[token, ttl_ms]
                    )
                except Exception:
                    return  # this node is away: the rest of its locks stay unknown
                out[i] = int(r) == 1

        async with anyio.create_task_group() as tg:
            for indexes in by_node.values():
                tg.start_soon(extend_on_node, indexes)
        if locks and all(r is None for r in out):
            raise RedisUnavailable("no lock could be extended: no primary answered")
        return out

    @channelled
    async def record_leases(self, ids: Sequence[str], ttl_ms: int, *, new: bool) -> None:
        """Write lease deadlines (server time + ``ttl_ms``) of assignment ids.

        ``new`` True adds leases of assignments still pending only (an owner stalled
        before recording must not add one for an assignment finished meanwhile);
        False only updates leases that still exist: a heartbeat racing a finish must
        not bring a finished assignment's lease back.
        """
        if ids:
            await self._lease("own" if new else "update", "", ids, ttl_ms)

    @channelled
    async def take_leases(self, ids: Sequence[str], consumer: str, ttl_ms: int) -> list[bool]:
        """For each assignment id, whether it is still pending with ``consumer``; each one
        that is gets its lease (server time + ``ttl_ms``). One round trip for all of an
        intake read's assignments, before their locks are taken: the check that a
        stalled consumer's assignment was not re-queued meanwhile, and the lease."""
        if not ids:
            return []
        return [int(flag) == 1 for flag in (await self._lease("own", consumer, ids, ttl_ms))[1:]]

    async def _lease(self, mode: str, consumer: str, ids: Sequence[str], ttl_ms: int) -> Any:
        return await self.scripts.lease(
            keys=[self.keys.leases, self.keys.assignments],
            args=[mode, ttl_ms, self.keys.group, consumer, *ids],
        )

    @channelled
    async def fenced_read(
        self,
        stream: str,
        token: str,
        consumer: str,
        count: int,
        ack: Sequence[str],
        *,
        claim: bool = False,
        reply_bytes: int = 0,
    ) -> ReadReply:
        """Ack ``ack`` and read up to ``count`` entries, only if ``token`` holds the lock.

        Pending entries of the stream (a previous owner's, or ours from a lost reply)
        come before new ones. No entry passes through Lua: ``fence.lua`` checks the
        token, acks and counts what is pending, and the XREADGROUP queued after it in
        the same MULTI reads. When something was pending, that read is discarded (the
        entries stay pending with us) and ``claim.lua`` claims the oldest pending ids,
        whose data XRANGE fetches. So a stalled owner whose fence fails reads only
        entries newer than anything its successor has read, and its successor claims
        them, in order, before reading further.

        Args:
            claim: the previous read returned claimed entries (``ReadReply.claimed``):
                claim first, and read new entries only once nothing is pending.
            reply_bytes: how large the entries read may be in all (the caller's
                guess): past :data:`LARGE_REPLY_BYTES` they are read on a connection
                of their own, not on the command channel.
        """
        large = reply_bytes > LARGE_REPLY_BYTES
        lock = self.keys.lock(stream)
        if count == 0:
            r = await self.scripts.fence(*self._fence(stream, token, ack))
            return ReadReply(int(r[0]) == 1, "0-0", [])
        if claim:
            claimed = await self._claim(lock, stream, token, consumer, count, ack, large)
            if not claimed.owned or claimed.entries or claimed.cancelled is not None:
                return claimed
            ack = ()
        for _ in range(3):
            fenced, read = await self._fence_and_read(stream, token, consumer, count, ack, large)
            ack = ()
            if int(fenced[0]) != 1:
                if read and not isinstance(read, BaseException):
                    await self._stray(stream, read)
                return NOT_OWNED
            # An empty reason is a cancel too (the default of cancel_stream): only a
            # missing marker (nil, or false under RESP3) is not.
            if len(fenced) > 3 and fenced[3] is not None and fenced[3] is not False:
                # Cancelled: what this read delivered stays pending with us, and the
                # cancellation's seal acks it unhandled.
                return ReadReply(True, "0-0", [], cancelled=text(fenced[3]))
            if int(fenced[2]) == 0:
                if isinstance(read, BaseException):
                    raise translate(read) from read
                batch, largest = self._entries(_stream_entries(read))
                return ReadReply(True, "0-0" if batch else text(fenced[1]), batch, largest)
            claimed = await self._claim(lock, stream, token, consumer, count, (), large)
            if not claimed.owned or claimed.entries or claimed.cancelled is not None:
                return claimed
        # Pending entries that vanished between claim and fetch: the caller reads again.
        return ReadReply(True, "0-0", [])

    async def _fence_and_read(
        self,
        stream: str,
        token: str,
        consumer: str,
        count: int,
        ack: Sequence[str],
        large: bool,
    ) -> tuple[Any, Any]:
        """MULTI, fence.lua, XREADGROUP, EXEC: ``(fence reply, read reply or error)``."""
        commands: list[tuple[Any, ...]] = [
            self.scripts.fence.command(*self._fence(stream, token, ack)),
            (
                "XREADGROUP",
                "GROUP",
                self.keys.group,
                consumer,
                "COUNT",
                count,
                "STREAMS",
                stream,
                ">",
            ),
        ]
        for attempt in range(2):
            fenced, read = await self.core.transaction(stream, commands, large=large)
            if not isinstance(fenced, rex.NoScriptError) or attempt:
                break
            # A restarted or promoted server has no scripts: load it and go again (the
            # discarded read left its entries pending with us: the retry claims them).
            await self.core.command(stream, "SCRIPT", "LOAD", self.scripts.fence.script)
        if isinstance(fenced, BaseException):
            raise translate(fenced, in_script=True) from fenced
        return fenced, read

    async def _stray(self, stream: str, read: Any) -> None:
        """Settle what a read behind a failed fence delivered to us (``stray.lua``):
        left pending for the stream's owner, or acked when it came after the end of a
        job of the name and no job started since. Best effort: if it fails, the entries
        stay pending with us, which the next job of the name settles."""
        ids = [entry_id for entry_id, _ in _stream_entries(read)]
        if not ids:
            return
        keys = self.keys
        try:
            await self.scripts.stray(
                keys=[keys.lock(stream), stream, keys.ended(stream)], args=[keys.group, *ids]
            )
        except Exception as exc:
            failure = translate(exc, in_script=True)
            log.warning(
                "stream %r: settling %d entries read after its lock was lost: %s: %s",
                stream,
                len(ids),
                type(failure).__name__,
                failure,
            )

    async def _claim(
        self,
        lock: str,
        stream: str,
        token: str,
        consumer: str,
        count: int,
        ack: Sequence[str],
        large: bool,
    ) -> ReadReply:
        r = await self.scripts.claim(
            keys=[lock, stream, self.keys.cancel(stream)],
            args=[token, self.keys.group, consumer, count, *ack],
        )
        if int(r[0]) != 1:
            return NOT_OWNED
        if len(r) > 2 and r[2] is not None and r[2] is not False:
            # Cancelled: nothing was claimed; the caller ends the stream.
            return ReadReply(True, "0-0", [], cancelled=text(r[2]))
        ids = [text(i) for i in r[1]]
        if not ids:
            return ReadReply(True, "0-0", [])
        batch, largest = self._entries(await self._fetch_claimed(stream, ids, large))
        return ReadReply(True, "0-0", batch, largest, claimed=True)

    async def _fetch_claimed(self, stream: str, ids: Sequence[str], large: bool) -> list[Any]:
        """The entries of claimed ``ids`` (ascending, as XAUTOCLAIM gives them), in order;
        one deleted since is left out.

        One XRANGE over their span, whose entries acked in between are dropped; only ids
        its COUNT cut off are fetched one by one. An owner's pending entries are mostly
        one read's batch, so a successor claiming 40 of them sends one command, not 40.
        """
        wanted = set(ids)
        limit = len(ids) + _CLAIM_SPAN_SLACK
        span = await self.core.command(
            stream, "XRANGE", stream, ids[0], ids[-1], "COUNT", limit, large=large
        )
        found = {text(item[0]): item for item in span if text(item[0]) in wanted}
        rest: list[str] = []
        if len(span) >= limit:  # cut off: what lies past its last entry, one by one
            last = id_order(text(span[-1][0]))
            rest = [i for i in ids if i not in found and id_order(i) > last]
        if rest:
            async with anyio.create_task_group() as tg:  # one write on the channel

                async def fetch(entry_id: str) -> None:
                    reply = await self.core.command(
                        stream, "XRANGE", stream, entry_id, entry_id, "COUNT", 1, large=large
                    )
                    if reply:
                        found[text(reply[0][0])] = reply[0]

                for entry_id in rest:
                    tg.start_soon(fetch, entry_id)
        return [found[i] for i in ids if i in found]

    @channelled
    async def newer_than(self, stream: str, after_id: str) -> bool:
        """Whether ``stream`` has an entry newer than ``after_id``, or no longer exists
        (the check after an idle stream's keyspace subscription, on a cluster)."""
        exists, newer = await self.core.transaction(
            stream,
            [("EXISTS", stream), ("XREVRANGE", stream, "+", f"({after_id}", "COUNT", 1)],
        )
        for reply in (exists, newer):
            if isinstance(reply, BaseException):
                raise translate(reply) from reply
        return int(exists) == 0 or bool(newer)

    @blocking
    async def wait_for_entries(self, stream: str, after_id: str, block_ms: int) -> None:
        """Block until ``stream`` has an entry newer than ``after_id`` or ``block_ms`` pass.

        A plain XREAD changes no consumer-group state, so a stalled owner that wakes up
        here pulls nothing into its pending list.
        """
        await self.client.xread({stream: after_id}, count=1, block=block_ms)
