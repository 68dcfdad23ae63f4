"""The only module that issues Redis commands; redis-py errors are translated here.

Callers get :class:`~streamjobs.RedisUnavailable` for anything transient
(connection refused or reset, timeouts, LOADING, CLUSTERDOWN, TRYAGAIN, failover)
and :class:`~streamjobs.RedisCommandError` for an error reply we did not expect.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

from redis import exceptions as rex

from ._keys import Keys
from ._scripts import Scripts
from .exceptions import RedisCommandError, RedisUnavailable

P = ParamSpec("P")
T = TypeVar("T")

RawFields = dict[str, bytes | str]
Entry = tuple[str, dict[str, str]]

_TRANSIENT: tuple[type[BaseException], ...] = (
    rex.ConnectionError,
    rex.TimeoutError,
    rex.BusyLoadingError,
    rex.ClusterDownError,
    rex.TryAgainError,
    rex.MasterDownError,
    rex.ReadOnlyError,
    OSError,
)
# Error replies that mean "the topology is changing, try again": a failover
# force-unblocks blocked reads with UNBLOCKED, a demoted primary answers READONLY.
_CLUSTER_TRANSIENT_TEXT = (
    "CLUSTERDOWN",
    "TRYAGAIN",
    "MOVED",
    "ASK ",
    "LOADING",
    "MASTERDOWN",
    "UNBLOCKED",
    "READONLY",
)


# Everything this boundary raises for a failed command: loops catch this, back off and
# carry on, so that no Redis failure (transient or not) kills a loop.
REDIS_FAILURES: tuple[type[Exception], ...] = (RedisUnavailable, RedisCommandError)


def translate(exc: BaseException) -> BaseException:
    """Map a redis-py (or socket) exception to the streamjobs tree."""
    if isinstance(exc, _TRANSIENT):
        return RedisUnavailable(f"{type(exc).__name__}: {exc}")
    if isinstance(exc, rex.RedisClusterException):
        return RedisUnavailable(f"{type(exc).__name__}: {exc}")
    if isinstance(exc, rex.ResponseError) and str(exc).startswith(_CLUSTER_TRANSIENT_TEXT):
        return RedisUnavailable(f"{type(exc).__name__}: {exc}")
    if isinstance(exc, rex.RedisError):
        return RedisCommandError(f"{type(exc).__name__}: {exc}")
    return exc


def translated(fn: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
    """Decorator: run ``fn`` and translate redis-py exceptions at this boundary."""

    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return await fn(*args, **kwargs)
        except (rex.RedisError, OSError) as exc:
            raise translate(exc) from exc

    return wrapper


def text(value: bytes | str | int) -> str:
    """A reply value as str (clients may or may not decode responses)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    return str(value)


def entries(raw: Sequence[Any] | None) -> list[Entry]:
    """Decode ``[[id, [f, v, ...]], ...]`` (Lua passes stream replies through raw)."""
    out: list[Entry] = []
    for item in raw or ():
        if not item:  # XAUTOCLAIM on 6.2 returns nil for deleted entries
            continue
        flat = item[1] or ()
        out.append(
            (text(item[0]), {text(flat[i]): text(flat[i + 1]) for i in range(0, len(flat), 2)})
        )
    return out


@dataclass(frozen=True, slots=True)
class Pending:
    """One entry of XPENDING's extended form."""

    id: str
    consumer: str
    idle_ms: int
    deliveries: int


class Gateway:
    """Commands of one service on one client. Constructing it does no I/O."""

    def __init__(self, client: Any, keys: Keys, *, dlq: str, dlq_maxlen: int) -> None:
        self.client = client
        self.keys = keys
        self.dlq = dlq
        self.dlq_maxlen = dlq_maxlen
        self.scripts = Scripts(client)
        self._is_cluster = hasattr(client, "get_primaries")

    # -- assignment stream ---------------------------------------------------------

    @translated
    async def ensure_group(self) -> None:
        """Create the LBS consumer group at id 0 (MKSTREAM); an existing group is fine."""
        try:
            await self.client.xgroup_create(
                self.keys.assignments, self.keys.group, id="0", mkstream=True
            )
        except rex.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    @translated
    async def read_assignments(
        self, consumer: str, count: int, block_ms: int
    ) -> list[tuple[str, RawFields]]:
        """New assignments for ``consumer`` (never its own pending ones: SPEC §4)."""
        reply = await self.client.xreadgroup(
            self.keys.group, consumer, {self.keys.assignments: ">"}, count=count, block=block_ms
        )
        out: list[tuple[str, RawFields]] = []
        if not reply:
            return out
        streams = reply.values() if isinstance(reply, dict) else [r[1] for r in reply]
        for batch in streams:
            if (
                batch
                and isinstance(batch[0], list)
                and batch
                and not isinstance(batch[0][0], bytes | str)
            ):
                batch = batch[0]  # RESP3 nests one level deeper
            for entry_id, fields in batch:
                out.append((text(entry_id), {text(k): v for k, v in (fields or {}).items()}))
        return out

    @translated
    async def fetch_assignment(self, entry_id: str) -> RawFields | None:
        """The fields of one LBS entry, or None if it was deleted."""
        reply = await self.client.xrange(self.keys.assignments, entry_id, entry_id, count=1)
        if not reply:
            return None
        _, fields = reply[0]
        return {text(k): v for k, v in (fields or {}).items()}

    @translated
    async def pending_page(self, min_idle_ms: int, start: str, count: int) -> list[Pending]:
        """One XPENDING page (ids >= ``start``) of entries idle at least ``min_idle_ms``."""
        reply = await self.client.xpending_range(
            self.keys.assignments, self.keys.group, start, "+", count, idle=min_idle_ms
        )
        return [
            Pending(
                id=text(p["message_id"]),
                consumer=text(p["consumer"]),
                idle_ms=int(p["time_since_delivered"]),
                deliveries=int(p["times_delivered"]),
            )
            for p in reply
        ]

    @translated
    async def pending_owner(self, entry_id: str) -> str:
        """The consumer an LBS entry is pending with ('' if it is not pending)."""
        reply = await self.client.xpending_range(
            self.keys.assignments, self.keys.group, entry_id, entry_id, 1
        )
        return text(reply[0]["consumer"]) if reply else ""

    @translated
    async def lease_scores(self, ids: Sequence[str]) -> list[float | None]:
        """Lease deadlines (server ms) of assignment ids; None where there is none."""
        if not ids:
            return []
        reply = await self.client.zmscore(self.keys.leases, list(ids))
        return [None if v is None else float(v) for v in reply]

    @translated
    async def server_time_ms(self) -> int:
        now_s, now_us = await self.client.time()
        return int(now_s) * 1000 + int(now_us) // 1000

    @translated
    async def finish(self, assignment_id: str, member: str) -> bool:
        """Ack and delete a completed assignment; False if it was no longer pending."""
        r = await self.scripts.finish(
            keys=[self.keys.assignments, self.keys.leases],
            args=[self.keys.group, assignment_id, member],
        )
        return int(r) == 1

    @translated
    async def requeue(self, assignment_id: str, member: str, retry_count: int | None) -> str | None:
        """Atomic XACK-first re-queue; ``retry_count`` None keeps the entry's own count."""
        r = await self.scripts.requeue(
            keys=[self.keys.assignments, self.keys.leases],
            args=[
                self.keys.group,
                assignment_id,
                member,
                "" if retry_count is None else str(retry_count),
            ],
        )
        return None if r is None else text(r)

    @translated
    async def dead_letter_assignment(
        self, assignment_id: str, member: str, meta: Sequence[tuple[str, str]]
    ) -> tuple[str, int] | None:
        """Atomic XACK, XADD to the DLQ, XDEL; None if the entry was not pending."""
        args: list[str | int] = [self.keys.group, assignment_id, self.dlq_maxlen, member]
        for k, v in meta:
            args += [k, v]
        r = await self.scripts.dead_letter(
            keys=[self.keys.assignments, self.dlq, self.keys.leases], args=args
        )
        if r is None:
            return None
        return text(r[0]), int(r[1])

    @translated
    async def dead_letter_entry(self, fields: Sequence[tuple[str, str]]) -> tuple[str, int]:
        """Append a dead letter for a data-stream entry; returns (id, entries trimmed)."""
        args: list[str | int] = [self.dlq_maxlen]
        for k, v in fields:
            args += [k, v]
        r = await self.scripts.dlq_add(keys=[self.dlq], args=args)
        return text(r[0]), int(r[1])

    # -- locks and data streams ----------------------------------------------------

    @translated
    async def acquire(self, stream: str, token: str, ttl_ms: int) -> bool:
        r = await self.scripts.acquire(
            keys=[self.keys.lock(stream), stream], args=[token, ttl_ms, self.keys.group]
        )
        return int(r) == 1

    @translated
    async def extend_many(self, locks: Sequence[tuple[str, str]], ttl_ms: int) -> list[bool]:
        """Extend each (stream, token) lock; one round trip on a standalone server."""
        if self._is_cluster:
            out = []
            for stream, token in locks:
                r = await self.scripts.extend(keys=[self.keys.lock(stream)], args=[token, ttl_ms])
                out.append(int(r) == 1)
            return out
        async with self.client.pipeline(transaction=False) as pipe:
            for stream, token in locks:
                await self.scripts.extend(
                    keys=[self.keys.lock(stream)], args=[token, ttl_ms], client=pipe
                )
            replies = await pipe.execute()
        return [int(r) == 1 for r in replies]

    @translated
    async def record_leases(self, members: Sequence[str], ttl_ms: int, *, new: bool) -> None:
        """Write lease deadlines (server time + ``ttl_ms``); ``new`` False only updates."""
        if members:
            mode = "add" if new else "update"
            await self.scripts.lease(keys=[self.keys.leases], args=[mode, ttl_ms, *members])

    @translated
    async def fenced_read(
        self, stream: str, token: str, consumer: str, count: int, ack: Sequence[str]
    ) -> tuple[bool, str, list[Entry]]:
        """Ack ``ack`` and read up to ``count`` entries, only if ``token`` holds the lock.

        Pending entries of the stream (a previous owner's, or ours from a lost reply)
        come before new ones.

        Returns:
            (owned, top_id, entries): top_id is the newest stream id when nothing was read.
        """
        r = await self.scripts.read(
            keys=[self.keys.lock(stream), stream],
            args=[token, self.keys.group, consumer, count, *ack],
        )
        if int(r[0]) != 1:
            return False, "", []
        return True, text(r[1]), entries(r[2])

    @translated
    async def wait_for_entries(self, stream: str, after_id: str, block_ms: int) -> None:
        """Block until ``stream`` has an entry newer than ``after_id`` or ``block_ms`` pass.

        A plain XREAD changes no consumer-group state, so a stalled owner that wakes up
        here pulls nothing into its pending list.
        """
        await self.client.xread({stream: after_id}, count=1, block=block_ms)

    @translated
    async def release(self, stream: str, token: str, keep_ms: int, ack: Sequence[str] = ()) -> bool:
        r = await self.scripts.release(
            keys=[self.keys.lock(stream), stream], args=[token, self.keys.group, keep_ms, *ack]
        )
        return int(r) == 1

    @translated
    async def lock_exists(self, stream: str) -> bool:
        return int(await self.client.exists(self.keys.lock(stream))) == 1

    @translated
    async def sweep_leases(self, horizon_ms: int, limit: int, recheck_ms: int) -> list[str]:
        r = await self.scripts.sweep(keys=[self.keys.leases], args=[horizon_ms, limit, recheck_ms])
        return [text(m) for m in r]
