"""The Redis boundary: every command streamjobs issues, and error translation.

Three kinds of connection, each with one owner:

* commands on the client the user passed in (assignment stream, locks, data
  streams, dead letters, lease index, producer writes): :class:`Gateway`, here;
* administrative commands on any client, including a plain client pinned to one
  cluster node (``CONFIG GET/SET notify-keyspace-events``, ``CLUSTER INFO/SLOTS``):
  the module functions here;
* pub/sub connections (``PSUBSCRIBE`` to keyspace events): ``_notifications``,
  which opens them on the per-node clients it makes.

redis-py errors are translated here and nowhere else. Callers get
:class:`~streamjobs.RedisUnavailable` for anything transient (connection refused or
reset, timeouts, LOADING, CLUSTERDOWN, TRYAGAIN, a failover's UNBLOCKED or
READONLY) and a :class:`~streamjobs.RedisCommandError` for an error reply that
retrying will not fix, classified into :class:`~streamjobs.NoSuchGroup`,
:class:`~streamjobs.WrongKeyType` and (inside our scripts)
:class:`~streamjobs.ScriptError`, of which :class:`EntryTooLarge` is the one a caller
acts on. Nobody outside this module looks at message text.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import ssl
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, ParamSpec, Protocol, TypeVar

import anyio
from redis import exceptions as rex

from ._deadletter import (
    DEAD_AT_FIELD,
    FIELDS_JSON_FIELD,
    META_FIELDS,
    SOURCE_ID_FIELD,
    SOURCE_STREAM_FIELD,
    Pairs,
    flatten,
)
from ._keys import Keys
from ._scripts import MAX_COPY_VALUES, NAMES, Scripts, source
from ._session import incarnation_of, parse_session_token
from ._session import member as session_member
from ._wire import (
    CANCEL_FIELD,
    EOS_FIELD,
    EOS_VALUE,
    FIRST_ID_FIELD,
    LOST_AT_FIELD,
    RETRY_FIELD,
    STREAM_FIELD,
    is_eos,
)
from .exceptions import (
    ConfigurationError,
    NoSuchGroup,
    PermissionDenied,
    RedisCommandError,
    RedisUnavailable,
    ScriptError,
    StreamJobsError,
    WrongKeyType,
)
from .metrics import ServiceSample

P = ParamSpec("P")
T = TypeVar("T")

RawFields = dict[str, bytes | str]
LostAt = int | Literal["lease"] | None
"""When a re-queued assignment's previous owner was lost (see ``Gateway.requeue``)."""
Entry = tuple[str, dict[str, str]]
Addr = tuple[str, int]
SlotMap = dict[tuple[int, int], Addr]

_TRANSIENT: tuple[type[BaseException], ...] = (
    rex.ConnectionError,
    rex.TimeoutError,
    rex.BusyLoadingError,
    rex.ClusterDownError,
    rex.TryAgainError,
    rex.MasterDownError,
    rex.ReadOnlyError,
    # MOVED and ASK (MovedError is an AskError): the slot is moving or moved in a
    # failover. redis-py strips the "MOVED " prefix from the message, so the prefix
    # test below never sees one that reaches us: a command we send on a connection of
    # our own (the fenced read's transaction) gets it raw.
    rex.AskError,
    rex.RedisClusterException,  # not a RedisError: a cluster with no reachable node
    OSError,
)
# Error replies that mean "the topology is changing, try again": a failover
# force-unblocks blocked reads with UNBLOCKED, a demoted primary answers READONLY.
_TRANSIENT_PREFIXES = (
    "CLUSTERDOWN",
    "TRYAGAIN",
    "MOVED",
    "ASK ",
    "LOADING",
    "MASTERDOWN",
    "UNBLOCKED",
    "READONLY",
    "BUSY ",  # a script past lua-time-limit (ours or another client's): it ends
)


class UnexpectedClientError(RedisUnavailable):
    """The client raised something that is not a Redis error while running a command.

    Seen in practice: ``AttributeError`` from inside redis-py when a connection is torn
    down under load during a failover. Treated as transient (the command may or may
    not have run, exactly as with a lost connection), but logged with its traceback.
    """


class EntryTooLarge(ScriptError):
    """TOOLARGE: ``requeue.lua`` refused to copy an assignment with more fields than
    one XADD in a script can carry (``_scripts.MAX_COPY_VALUES``). Nothing was written:
    the assignment is still pending, and recovery dead-letters it as ``too_large``."""


_TOO_LARGE_PREFIX = "TOOLARGE"
# What a script gets when its user may not run a command it calls (not NOPERM).
_SCRIPT_NOPERM = "user executing the script can't run this command"

_CURSOR_KEEP_MS = 24 * 3600 * 1000

DEAD_MARKER_TTL_MS = 24 * 3600 * 1000
ENDED_MARKER_TTL_MS = 24 * 3600 * 1000
"""How long a job that ended early is remembered (``Keys.ended``): what its producer
appends to the stream within that time is skipped by the next job of the name."""
NOT_ACQUIRED, ACQUIRED, ACQUIRED_ENDED = 0, 1, 2
"""What :meth:`Gateway.acquire` answers."""
"""How long a data entry's dead-letter marker is kept (``Keys.dead_marker``): far
longer than an owner's death takes to be noticed and the entry handled again."""

PLAIN_DEAD_LETTER_BYTES = 256 * 1024
"""Entries larger than this are dead-lettered by a plain XADD (in a MULTI), not by
``dlq_add.lua``: a script copying a 50 MB entry ran for 225-353 ms."""

REDIS_FAILURES: tuple[type[Exception], ...] = (RedisUnavailable, RedisCommandError)
"""Everything this boundary raises for a failed command. Loops catch this, back off
and carry on, so that no Redis failure (transient or not) ends a loop."""


def translate(exc: BaseException, *, in_script: bool = False) -> BaseException:
    """Map a redis-py (or socket) exception to the streamjobs tree.

    Args:
        exc: what redis-py raised.
        in_script: the command was one of our Lua scripts, so an otherwise unknown
            error reply is the script's own failure.
    """
    message = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, _TRANSIENT):
        return RedisUnavailable(message)
    if not isinstance(exc, rex.RedisError):
        return exc
    reply = str(exc)
    if isinstance(exc, rex.NoPermissionError):  # NOPERM, its prefix stripped by redis-py
        return PermissionDenied(message)
    if isinstance(exc, rex.ResponseError):
        if reply.startswith(_TRANSIENT_PREFIXES):
            return RedisUnavailable(message)
        if reply.startswith("NOGROUP"):
            return NoSuchGroup(message)
        if reply.startswith("NOPERM") or _SCRIPT_NOPERM in reply:
            return PermissionDenied(message)
        if reply.startswith("WRONGTYPE"):
            return WrongKeyType(message)
        if in_script and reply.startswith(_TOO_LARGE_PREFIX):
            return EntryTooLarge(message)
        if in_script:
            return ScriptError(message)
    return RedisCommandError(message)


_HOLDING: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "streamjobs_holds_a_command_slot", default=False
)


async def _initialized(target: Any) -> None:
    """Initialize a cluster client that has no default node (no slot table) yet.

    Works around redis-py's asyncio ``RedisCluster.execute_command`` (seen in 8.1),
    which picks a command's route *before* it initializes the client: while
    ``get_default_node()`` is None (a fresh client, or one that closed itself to
    reinitialize) a command its policy table does not know (EVALSHA, PERSIST, XADD,
    ...) gets the keyless policy and goes to a random primary, which answers MOVED.
    Every ``reinitialize_steps``-th (5th) MOVED, ``_execute_command`` calls
    ``RedisCluster.aclose()``, and ``ClusterNode.disconnect()`` closes every
    connection of every node, in use or not: a connection another task is still
    opening then fails in ``on_connect`` with ``AttributeError: 'NoneType' object
    has no attribute 'writelines'``, which redis-py does not retry (issue 21: about
    one producer call in 90 on a fresh client, with no fault at all). Initialized
    first, the client routes every command by its key's slot. ``initialize()`` takes
    the client's lock and returns at once if another task did the work.
    """
    get_default_node = getattr(target, "get_default_node", None)
    if get_default_node is not None and get_default_node() is None:
        await target.initialize()


def _translating(
    in_script: bool, *, limited: bool = True
) -> Callable[[Callable[P, Awaitable[T]]], Callable[P, Coroutine[Any, Any, T]]]:
    def decorate(fn: Callable[P, Awaitable[T]]) -> Callable[P, Coroutine[Any, Any, T]]:
        async def call(*args: P.args, **kwargs: P.kwargs) -> T:
            try:
                if args:  # the gateway's client, or the client a module function takes
                    await _initialized(args[0].client if isinstance(args[0], Gateway) else args[0])
                result = await fn(*args, **kwargs)
            except (rex.RedisError, rex.RedisClusterException, OSError) as exc:
                raise translate(exc, in_script=in_script) from exc
            except StreamJobsError:
                raise
            except Exception as exc:
                raise UnexpectedClientError(f"{type(exc).__name__}: {exc}") from exc
            if args and isinstance(args[0], Gateway):
                args[0].last_ok = time.monotonic()  # readiness: Redis answered
            return result

        @functools.wraps(fn)
        async def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
            # A gateway method takes one of its consumer's command slots (nested
            # calls of the same task reuse it), so the connections a consumer opens
            # stay bounded however many of its streams act at once.
            limiter = getattr(args[0], "limiter", None) if limited and args else None
            if limiter is None or _HOLDING.get():
                return await call(*args, **kwargs)
            async with limiter:
                token = _HOLDING.set(True)
                try:
                    return await call(*args, **kwargs)
                finally:
                    _HOLDING.reset(token)

        return wrapper

    return decorate


translated = _translating(in_script=False)
"""Decorator: run a coroutine of plain commands, translating redis-py exceptions."""
script = _translating(in_script=True)
"""Decorator: like :func:`translated`, for a coroutine that runs one of our scripts."""
blocking = _translating(in_script=False, limited=False)
"""Decorator: like :func:`translated`, for a blocking read, which takes no command
slot (a long wait must not starve the others; the pool check counts these)."""


def _release(node: Any, connection: Any) -> None:
    """Give a connection back to a cluster node's pool: ``ClusterNode.release`` where
    it exists (redis-py 6+); redis-py 5 has no such method, and takes connections
    back through its free queue."""
    release = getattr(node, "release", None)
    if release is not None:
        release(connection)
    else:
        node._free.append(connection)


async def _raw_transaction(connection: Any, commands: Sequence[tuple[Any, ...]]) -> Any:
    """MULTI, ``commands``, EXEC in one write on ``connection``; the EXEC reply, unparsed.

    The hot read path's transaction, sent below redis-py's pipeline: the replies skip
    its per-command callbacks (``sized_entries`` reads the raw shape) and its
    bookkeeping, measured at about a fifth of the client's time per batch.
    """
    await connection.send_packed_command(
        connection.pack_commands([("MULTI",), *commands, ("EXEC",)])
    )
    for _ in range(len(commands) + 1):  # OK, then QUEUED per command
        await connection.read_response()
    return await connection.read_response()


def _exec_replies(replies: Any) -> list[Any]:
    if replies is None:  # EXEC aborted (never happens without WATCH)
        raise RedisUnavailable("EXEC aborted")
    return list(replies)


_CLAIM_SPAN_SLACK = 100
"""Entries acked between claimed ones that one XRANGE over the claimed span may carry."""


def id_order(entry_id: str) -> tuple[int, int]:
    """A stream entry id as a sortable pair ((0, 0) if it is not one)."""
    ms, _, seq = entry_id.partition("-")
    try:
        return int(ms), int(seq or 0)
    except ValueError:
        return 0, 0


def text(value: bytes | str | int) -> str:
    """A reply value as str (clients may or may not decode responses)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    return str(value)


class ReadReply(NamedTuple):
    """What one fenced read of a data stream returned."""

    owned: bool
    """The token held the lock (False: nothing was acked or read)."""
    top: str
    """When nothing was read: the newest id the group has seen, to wait for a newer one."""
    entries: list[Entry]
    largest_bytes: int = 0
    """Size of the largest entry read (its field names and values), in bytes."""
    claimed: bool = False
    """The entries came from the pending list: more may be pending, so the next read
    should claim first (``fenced_read(claim=True)``)."""
    cancelled: str | None = None
    """The stream was cancelled (``Producer.cancel_stream``), for this reason: hand
    nothing more to ``handle()`` and end it."""


NOT_OWNED = ReadReply(False, "", [])


def _size(value: Any) -> int:
    return len(value) if isinstance(value, bytes | str) else len(str(value))


def _decoded(body: Any) -> tuple[dict[str, str], int]:
    """One entry's fields, decoded, and their size in bytes (the hot paths: a raw reply
    of bytes, or one redis-py parsed into a dict; anything else takes the general path)."""
    if type(body) is list:  # a raw reply: [field, value, field, value, ...]
        try:
            # bytes.decode without arguments is CPython's fastest UTF-8 path; a value
            # that is not UTF-8 (or not bytes) takes the general path below.
            values = iter(map(bytes.decode, body))
            return dict(zip(values, values, strict=True)), sum(map(len, body))
        except (TypeError, ValueError):  # UnicodeDecodeError is a ValueError
            pass
    elif type(body) is dict:
        try:
            fields = {
                k.decode("utf-8", "surrogateescape"): v.decode("utf-8", "surrogateescape")
                for k, v in body.items()
            }
            return fields, sum(map(len, body)) + sum(map(len, body.values()))
        except AttributeError:  # not bytes
            pass
    pairs = (
        list(body.items())
        if isinstance(body, Mapping)
        else [(body[i], body[i + 1]) for i in range(0, len(body), 2)]
    )
    return {text(k): text(v) for k, v in pairs}, sum(_size(k) + _size(v) for k, v in pairs)


def sized_entries(raw_entries: Sequence[Any] | None) -> tuple[list[Entry], int]:
    """Decode stream entries as redis-py parsed them (``(id, {field: value})`` pairs,
    or flat ``[f, v, ...]`` lists) and measure the largest one in bytes."""
    out: list[Entry] = []
    largest = 0
    for item in raw_entries or ():
        if not item or item[1] is None:  # an entry deleted after it was claimed
            continue
        fields, size = _decoded(item[1])
        if size > largest:
            largest = size
        out.append((text(item[0]), fields))
    return out, largest


def _stream_entries(reply: Any) -> Sequence[Any]:
    """The entries of an XREADGROUP reply for one stream, RESP2 or RESP3 shaped."""
    if not reply:
        return ()
    batches = list(reply.values()) if isinstance(reply, dict) else [r[1] for r in reply]
    batch = batches[0]
    if batch and isinstance(batch[0], list) and not isinstance(batch[0][0], bytes | str):
        batch = batch[0]  # RESP3 nests one level deeper
    return batch  # type: ignore[no-any-return]


def raw(values: Sequence[str]) -> list[bytes]:
    """Strings that may have come from :func:`text` as the bytes they were decoded from.

    Data-entry fields reach ``handle()`` decoded with ``surrogateescape``; a dead letter
    must write those exact bytes back (redis-py's encoder would refuse the surrogates).
    """
    return [v.encode("utf-8", "surrogateescape") for v in values]


def _raw_fields(fields: Mapping[Any, Any] | None) -> RawFields:
    return {text(k): v for k, v in (fields or {}).items()}


SessionMode = Literal["create", "renew", "end", "forget"]


@dataclass(frozen=True, slots=True)
class Pending:
    """One entry of XPENDING's extended form: its id, the consumer holding it, and how
    long ago it was delivered (ms)."""

    id: str
    consumer: str
    idle_ms: int = field(default=0, compare=False)


class StreamGateway(Protocol):
    """The commands the runtime needs. :class:`Gateway` runs them on Redis; the test
    suite has an in-memory fake of this protocol for the life-cycle logic."""

    keys: Keys

    async def ensure_group(self) -> None: ...
    async def load_scripts(self) -> None: ...
    async def read_assignments(
        self, consumer: str, count: int, block_ms: int
    ) -> list[tuple[str, RawFields]]: ...
    async def fetch_assignment(self, entry_id: str) -> RawFields | None: ...
    async def pending_page(
        self, min_idle_ms: int, start: str, count: int, consumer: str | None = None
    ) -> list[Pending]: ...
    async def pending_owner(self, entry_id: str) -> str: ...
    async def lease_scores(self, ids: Sequence[str]) -> list[float | None]: ...
    async def server_time_ms(self) -> int: ...
    async def ping(self) -> None: ...
    async def sample(self) -> ServiceSample: ...
    async def finish(self, assignment_id: str) -> bool: ...
    async def requeue(
        self, assignment_id: str, retry_count: int | None, *, lost_at: LostAt = None
    ) -> str | None: ...
    async def dead_letter_assignment(
        self, assignment_id: str, meta: Pairs
    ) -> tuple[str, int] | None: ...
    async def dead_letter_entry(self, fields: Pairs) -> tuple[str, int]: ...
    async def acquire(
        self, stream: str, token: str, ttl_ms: int, replace: str = "", job: str = ""
    ) -> int: ...
    async def extend_many(
        self, locks: Sequence[tuple[str, str]], ttl_ms: int
    ) -> list[bool | None]: ...
    async def record_leases(self, ids: Sequence[str], ttl_ms: int, *, new: bool) -> None: ...
    async def fenced_read(
        self,
        stream: str,
        token: str,
        consumer: str,
        count: int,
        ack: Sequence[str],
        *,
        claim: bool = False,
    ) -> ReadReply: ...
    async def wait_for_entries(self, stream: str, after_id: str, block_ms: int) -> None: ...
    async def release(
        self, stream: str, token: str, keep_ms: int, ack: Sequence[str] = ()
    ) -> bool: ...
    async def lock_exists(self, stream: str) -> bool: ...
    async def lock_alive(self, stream: str) -> bool: ...
    async def lock_state(self, stream: str) -> tuple[bool, str | None]: ...
    async def session_alive(
        self, consumer: str, incarnation: str, service: str | None = None
    ) -> bool: ...
    async def lock_holder(self, stream: str) -> str | None: ...
    async def lock_and_cancel(self, stream: str) -> tuple[str | None, str | None]: ...
    async def is_end_marker(self, stream: str, entry_id: str) -> bool: ...
    async def seal(
        self,
        stream: str,
        token: str,
        keep_ms: int,
        ack: Sequence[str] = (),
        *,
        cancelled: bool = False,
        job: str = "",
    ) -> bool: ...
    async def touch_session(self, consumer: str, value: str, ttl_ms: int) -> None: ...
    async def end_session(self, consumer: str) -> None: ...
    async def session(
        self, mode: SessionMode, consumer: str, value: str, ttl_ms: int, incarnation: str
    ) -> bool: ...
    async def sweep_sessions(self, limit: int, recheck_ms: int) -> list[tuple[str, int]]: ...
    async def next_due_ms(self) -> int | None: ...
    async def sweep_leases(
        self, horizon_ms: int, limit: int, recheck_ms: int
    ) -> list[tuple[str, int]]: ...
    async def prune_consumers(self, min_idle_ms: int, keep: str) -> list[str]: ...
    async def take_scan_lease(self, owner: str, ttl_ms: int) -> bool: ...
    async def unblock(self, client_id: int) -> bool: ...
    async def scan_cursor(self) -> str: ...
    async def save_scan_cursor(self, cursor: str) -> None: ...


class Gateway:
    """Commands of one service on one client. Constructing it does no I/O.

    Args:
        client: ``redis.asyncio.Redis`` or ``RedisCluster``.
        keys: the service's key names.
        dlq: the dead-letter stream; default ``keys.dead_letters``.
        dlq_maxlen: approximate cap of the dead-letter stream; 0 = unbounded.

    Attributes:
        max_copy_values: the most field names and values a script copies field by
            field (``_scripts.MAX_COPY_VALUES``; tests lower it).
    """

    def __init__(self, client: Any, keys: Keys, *, dlq: str | None = None, dlq_maxlen: int = 0):
        self.client = client
        self.keys = keys
        self.limiter: anyio.CapacityLimiter | None = None
        """Bounds the commands in flight (set by a running consumer; None: no bound)."""
        self.dlq = dlq or keys.dead_letters
        self.dlq_maxlen = dlq_maxlen
        self.max_copy_values = MAX_COPY_VALUES
        self.scripts = Scripts(client)
        self._is_cluster = hasattr(client, "get_primaries")
        self.last_ok: float | None = None
        """When (``time.monotonic()``) a command of this gateway last got a reply."""

    # -- producer writes -----------------------------------------------------------

    @script
    async def add_assignment(
        self,
        stream: str,
        fields: Mapping[str, str],
        *,
        idempotency_key: str | None = None,
        window_ms: int = 0,
    ) -> tuple[str, bool]:
        """Queue an assignment for data stream ``stream`` unless one is unfinished
        (``add.lua``, docs/design.md#submission).

        Args:
            stream: the data stream, the name ``fields`` carry.
            fields: the new assignment's fields.
            idempotency_key: if given, a repeat within ``window_ms`` returns the id this
                call returns, even once that job has finished.
            window_ms: how long the idempotency key is kept; above 0 with a key
                (``ConfigurationError`` otherwise: the script's last write would fail).

        Returns:
            (assignment id, True if it was queued by this call).

        Raises:
            WrongKeyType: the assignment stream, the index or the idempotency key holds
                another type; nothing was written.
        """
        keys = [self.keys.assignments, self.keys.active]
        if idempotency_key is not None:
            if window_ms <= 0:  # SET PX would fail after the XADD: refuse it up front
                raise ConfigurationError("window_ms", f"must be above 0 with a key: {window_ms}")
            keys.append(self.keys.idempotency(idempotency_key))
        flat = [part for pair in fields.items() for part in pair]
        r = await self.scripts.add(keys=keys, args=[stream, window_ms, *flat])
        return text(r[0]), int(r[1]) == 1

    @script
    async def start_job(self, stream: str, job: str, *, created: bool) -> bool:
        """``start_job.lua``, before ``add.lua`` (``job`` '') or after it answered
        ``job``: if an earlier job of the name ended (its ended-job marker names another
        job), what was appended after its end is skipped; with ``created``, the
        retention TTL and the cancel marker an earlier job left go
        (docs/design.md#job-identity). True if something was skipped."""
        r = await self.scripts.start_job(
            keys=[stream, self.keys.cancel(stream), self.keys.ended(stream)],
            args=[self.keys.group, job, "1" if created else "0"],
        )
        return int(r) == 1

    @script
    async def cancel_queued(self, stream: str) -> tuple[str, str, str]:
        """``cancel.lua``: remove ``stream``'s indexed assignment if not delivered yet.

        Returns:
            ('removed' | 'delivered' | 'none', the assignment's id or '', its job or '').
        """
        r = await self.scripts.cancel(
            keys=[self.keys.assignments, self.keys.active, self.keys.leases],
            args=[self.keys.group, stream, FIRST_ID_FIELD],
        )
        return text(r[0]), text(r[1]), text(r[2])

    @script
    async def skip_unread(self, stream: str, job: str) -> None:
        """``skip_unread.lua``: move the service's group on ``stream`` to its end (made
        there if missing) and mark ``job`` ended, so what a cancelled, never-read job left,
        or its producer appends later, is not handed to the next job of the same name."""
        await self.scripts.skip_unread(
            keys=[stream, self.keys.ended(stream)], args=[self.keys.group, job, ENDED_MARKER_TTL_MS]
        )

    @script
    async def signal_cancel(
        self, stream: str, reason: str, marker_ttl_ms: int, job: str = ""
    ) -> bool:
        """Tell ``stream``'s owner to stop (``signal_cancel.lua``): the cancel marker its
        next fenced read sees, and in the same script an end marker carrying the reason
        that wakes an owner waiting for entries (not written if the stream is gone or
        already ends in an end marker). ``job``: the job being cancelled ('' unknown).
        False if the cancel was moot (that job is over already): nothing was written."""
        r = await self.scripts.signal_cancel(
            keys=[stream, self.keys.cancel(stream), self.keys.ended(stream)],
            args=[
                reason, marker_ttl_ms, EOS_FIELD, EOS_VALUE, CANCEL_FIELD, self.keys.group, job,
            ],
        )  # fmt: skip
        return int(r) != 2

    @translated
    async def append(self, stream: str, fields: Mapping[str, str | bytes | int | float]) -> str:
        """Append one entry to a data stream; returns its id."""
        return text(await self.client.xadd(stream, dict(fields)))

    # -- assignment stream ---------------------------------------------------------

    @translated
    async def load_scripts(self) -> None:
        """SCRIPT LOAD every script (on every primary of a cluster), so that the first
        calls need no retry, and a missing ``script|load`` permission shows at start-up."""
        for name in NAMES:
            await self.client.script_load(source(name))

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

    @blocking
    async def read_assignments(
        self, consumer: str, count: int, block_ms: int
    ) -> list[tuple[str, RawFields]]:
        """New assignments for ``consumer``, never its own pending ones: a restarted
        consumer gets its stranded work back only through recovery, which counts it
        (docs/design.md#recovery)."""
        reply = await self.client.xreadgroup(
            self.keys.group, consumer, {self.keys.assignments: ">"}, count=count, block=block_ms
        )
        out: list[tuple[str, RawFields]] = []
        if not reply:
            return out
        streams = reply.values() if isinstance(reply, dict) else [r[1] for r in reply]
        for batch in streams:
            if batch and isinstance(batch[0], list) and not isinstance(batch[0][0], bytes | str):
                batch = batch[0]  # RESP3 nests one level deeper
            for entry_id, fields in batch:
                out.append((text(entry_id), _raw_fields(fields)))
        return out

    @translated
    async def fetch_assignment(self, entry_id: str) -> RawFields | None:
        """The fields of one LBS entry, or None if it was deleted."""
        reply = await self.client.xrange(self.keys.assignments, entry_id, entry_id, count=1)
        if not reply:
            return None
        return _raw_fields(reply[0][1])

    @translated
    async def pending_page(
        self, min_idle_ms: int, start: str, count: int, consumer: str | None = None
    ) -> list[Pending]:
        """One XPENDING page (ids >= ``start``) of entries idle at least ``min_idle_ms``,
        of every consumer or only of ``consumer``."""
        reply = await self.client.xpending_range(
            self.keys.assignments,
            self.keys.group,
            start,
            "+",
            count,
            consumername=consumer,
            idle=min_idle_ms,
        )
        return [
            Pending(
                id=text(p["message_id"]),
                consumer=text(p["consumer"]),
                idle_ms=int(p["time_since_delivered"]),
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
    async def ping(self) -> None:
        await self.client.ping()

    @translated
    async def sample(self) -> ServiceSample:
        """Pending assignments and the oldest one's age, the DLQ's length and the
        consumer names of the group: four reads, none of them proportional to the
        data (XPENDING's summary form, XLEN, XINFO GROUPS, TIME)."""
        summary = await self.client.xpending(self.keys.assignments, self.keys.group)
        dlq_length = await self.client.xlen(self.dlq)
        groups = await self.client.xinfo_groups(self.keys.assignments)
        now_ms = await self.server_time_ms()
        pending = int(summary.get("pending", 0) or 0)
        oldest = summary.get("min")
        age_s = 0.0
        if pending and oldest:
            age_s = max(0.0, (now_ms - int(text(oldest).split("-")[0])) / 1000)
        consumers = next(
            (int(g["consumers"]) for g in groups if text(g["name"]) == self.keys.group), 0
        )
        return ServiceSample(
            pending=pending, oldest_pending_age_s=age_s, dlq_length=dlq_length, consumers=consumers
        )

    @script
    async def finish(self, assignment_id: str) -> bool:
        """Ack and delete a completed assignment; False if it was no longer pending.

        Its lease goes, and its stream's entry in the active-assignment index if that
        points at it (the script reads the stream's name from the entry).
        """
        r = await self.scripts.finish(
            keys=[self.keys.assignments, self.keys.leases, self.keys.active],
            args=[self.keys.group, assignment_id, STREAM_FIELD],
        )
        return int(r) == 1

    @script
    async def requeue(
        self, assignment_id: str, retry_count: int | None, *, lost_at: LostAt = None
    ) -> str | None:
        """Atomic XACK-first re-queue; ``retry_count`` None keeps the entry's own count.

        ``lost_at`` is when the previous owner was lost (server ms), or ``"lease"`` (the
        entry's lease deadline, or now), for a recovery; the copy carries it in
        ``_lost_at``. None for anything else (a hand-back): the copy has no such field.

        Returns the new entry's id, or None if the entry was not pending (someone else
        re-queued or finished it). Its lease is forgotten either way. If the active-
        assignment index pointed at the entry it points at the copy (the script reads
        the stream's name from the entry, so every caller keeps the index right).

        Raises:
            EntryTooLarge: the entry has too many fields to copy; it is still pending
                and its lease is kept (nothing was written).
            WrongKeyType: the assignment stream is not a stream (nothing was written).
        """
        r = await self.scripts.requeue(
            keys=[self.keys.assignments, self.keys.leases, self.keys.active],
            args=[
                self.keys.group,
                assignment_id,
                RETRY_FIELD,
                "" if retry_count is None else str(retry_count),
                self.max_copy_values,
                STREAM_FIELD,
                FIRST_ID_FIELD,
                LOST_AT_FIELD,
                "" if lost_at is None else str(lost_at),
            ],
        )
        return None if r is None else text(r)

    @script
    async def dead_letter_assignment(
        self, assignment_id: str, meta: Pairs
    ) -> tuple[str, int] | None:
        """Atomic XACK, XADD to the DLQ, XDEL; None if the entry was not pending.

        An entry too large to copy field by field is carried in ``_fields_json``. Its
        stream's entry in the active-assignment index goes if it points at it.

        Returns:
            (dead letter id, entries trimmed off the DLQ by MAXLEN).

        Raises:
            WrongKeyType: the dead-letter key holds another type; nothing was written,
                the entry is still pending.
        """
        r = await self.scripts.dead_letter(
            keys=[self.keys.assignments, self.dlq, self.keys.leases, self.keys.active],
            args=[
                self.keys.group,
                assignment_id,
                self.dlq_maxlen,
                DEAD_AT_FIELD,
                FIELDS_JSON_FIELD,
                self.max_copy_values,
                STREAM_FIELD,
                *raw(flatten(meta)),
            ],
        )
        if r is None:
            return None
        return text(r[0]), int(r[1])

    @script
    async def dead_letter_entry(self, fields: Pairs) -> tuple[str, int]:
        """Append a dead letter for a data-stream entry; returns (id, entries trimmed).

        ``fields`` are the original fields and the metadata (told apart by name, see
        ``_deadletter.entry_dead_letter``). An entry too large to copy field by field is
        carried in ``_fields_json``.

        Raises:
            WrongKeyType: the dead-letter key holds another type; nothing was written.
        """
        meta = [pair for pair in fields if pair[0] in META_FIELDS]
        original = [pair for pair in fields if pair[0] not in META_FIELDS]
        found = dict(meta)
        marker = self.keys.dead_marker(
            found.get(SOURCE_STREAM_FIELD, ""), found.get(SOURCE_ID_FIELD, "")
        )
        if (
            sum(len(k) + len(v) for k, v in original) > PLAIN_DEAD_LETTER_BYTES
            and 2 * (len(fields) + 1) <= self.max_copy_values
            and all(k != FIELDS_JSON_FIELD for k, _ in original)
        ):
            return await self._dead_letter_plain(meta, original, marker)
        r = await self.scripts.dlq_add(
            keys=[self.dlq, marker],
            args=[
                self.dlq_maxlen,
                DEAD_AT_FIELD,
                FIELDS_JSON_FIELD,
                self.max_copy_values,
                2 * len(meta),
                *raw(flatten(meta)),
                *raw(flatten(original)),
                DEAD_MARKER_TTL_MS,
            ],
        )
        return text(r[0]), int(r[1])

    async def _dead_letter_plain(
        self, meta: Pairs, original: Pairs, marker: str
    ) -> tuple[str, int]:
        """``dlq_add.lua`` without the script, for a big entry: one MULTI of XLEN, XADD,
        XLEN on the dead-letter stream, so the entry's data never passes through Lua.
        The marker is read before and set after: unlike the script, not atomic with the
        write, so a crash right after the MULTI, or two owners dead-lettering the same
        big entry at once (a disowned one's call in flight), can still duplicate it."""
        done = await self.client.get(marker)
        if done is not None:
            return text(done), 0
        now_ms = await self.server_time_ms()
        trim: tuple[Any, ...] = ("MAXLEN", "~", self.dlq_maxlen) if self.dlq_maxlen > 0 else ()
        flat = raw(flatten([*original, *meta, (DEAD_AT_FIELD, str(now_ms))]))
        replies = await self._transaction(
            self.dlq,
            [("XLEN", self.dlq), ("XADD", self.dlq, *trim, "*", *flat), ("XLEN", self.dlq)],
        )
        for reply in replies:
            if isinstance(reply, BaseException):
                raise translate(reply) from reply
        before, dlq_id, after = replies
        await self.client.set(marker, dlq_id, px=DEAD_MARKER_TTL_MS)
        return text(dlq_id), int(before) + 1 - int(after)

    # -- locks and data streams ----------------------------------------------------

    @script
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
        r = await self.scripts.acquire(
            keys=[self.keys.lock(stream), stream, self.keys.ended(stream)],
            args=[token, ttl_ms, self.keys.group, replace, job],
        )
        return int(r)

    @script
    async def extend_many(self, locks: Sequence[tuple[str, str]], ttl_ms: int) -> list[bool | None]:
        """Extend each (stream, token) lock (compare-and-set on the token).

        Returns, per lock: True extended, False gone or someone else's, None unknown
        (its node could not be reached). On a standalone server it is one pipelined
        round trip and all or nothing (it raises). On a cluster the locks are grouped
        by node and each node is asked concurrently, so one unreachable primary
        (mid-failover) does not keep the locks on the others from being extended.
        """
        if not self._is_cluster:
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

    @script
    async def record_leases(self, ids: Sequence[str], ttl_ms: int, *, new: bool) -> None:
        """Write lease deadlines (server time + ``ttl_ms``) of assignment ids.

        ``new`` True adds leases of assignments still pending only (an owner stalled
        before recording must not add one for an assignment finished meanwhile);
        False only updates leases that still exist: a heartbeat racing a finish must
        not bring a finished assignment's lease back.
        """
        if ids:
            mode = "add" if new else "update"
            await self.scripts.lease(
                keys=[self.keys.leases, self.keys.assignments],
                args=[mode, ttl_ms, self.keys.group, *ids],
            )

    @script
    async def fenced_read(
        self,
        stream: str,
        token: str,
        consumer: str,
        count: int,
        ack: Sequence[str],
        *,
        claim: bool = False,
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
        """
        lock = self.keys.lock(stream)
        group = self.keys.group
        cancel = self.keys.cancel(stream)
        if count == 0:
            r = await self.scripts.fence(keys=[lock, stream, cancel], args=[token, group, *ack])
            return ReadReply(int(r[0]) == 1, "0-0", [])
        if claim:
            claimed = await self._claim(lock, stream, token, consumer, count, ack)
            if not claimed.owned or claimed.entries:
                return claimed
            ack = ()
        for _ in range(3):
            fenced, read = await self._fence_and_read(
                lock, stream, cancel, token, consumer, count, ack
            )
            ack = ()
            if int(fenced[0]) != 1:
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
                batch, largest = sized_entries(_stream_entries(read))
                return ReadReply(True, "0-0" if batch else text(fenced[1]), batch, largest)
            claimed = await self._claim(lock, stream, token, consumer, count, ())
            if not claimed.owned or claimed.entries:
                return claimed
        # Pending entries that vanished between claim and fetch: the caller reads again.
        return ReadReply(True, "0-0", [])

    async def _fence_and_read(
        self,
        lock: str,
        stream: str,
        cancel: str,
        token: str,
        consumer: str,
        count: int,
        ack: Sequence[str],
    ) -> tuple[Any, Any]:
        """MULTI, fence.lua, XREADGROUP, EXEC: ``(fence reply, read reply or error)``."""
        fence = self.scripts.fence
        commands: list[tuple[Any, ...]] = [
            ("EVALSHA", fence.sha, 3, lock, stream, cancel, token, self.keys.group, *ack),
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
            fenced, read = await self._transaction(stream, commands)
            if not isinstance(fenced, rex.NoScriptError) or attempt:
                break
            # A restarted or promoted server has no scripts: load it and go again (the
            # discarded read left its entries pending with us: the retry claims them).
            await self.client.script_load(fence.script)
        if isinstance(fenced, BaseException):
            raise translate(fenced, in_script=True) from fenced
        return fenced, read

    async def _transaction(self, key: str, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        """Run ``commands`` (all on ``key``'s slot) in one MULTI/EXEC; error replies are
        returned in place, as exceptions.

        It goes raw over one connection of the pool (on a cluster, of the primary that
        holds ``key``'s slot): redis-py's cluster pipeline has no usable transactions
        across the versions we support, and on a standalone server its pipeline's
        per-command parsing and bookkeeping cost more client time than the batch's own
        entries. Replies are then unparsed (what :func:`sized_entries` reads).
        """
        if not hasattr(self.client, "get_node_from_key"):
            pool = self.client.connection_pool
            try:
                connection = await pool.get_connection()
            except TypeError:  # redis-py before 5.3 wants a command name
                connection = await pool.get_connection("MULTI")
            try:
                replies = await _raw_transaction(connection, commands)
            except BaseException:
                await connection.disconnect()  # replies may be left unread on the socket
                raise
            finally:
                with anyio.CancelScope(shield=True):
                    await pool.release(connection)
            return _exec_replies(replies)
        node = self.client.get_node_from_key(key)
        connection = node.acquire_connection()
        try:
            replies = await _raw_transaction(connection, commands)
        except BaseException as exc:
            # Replies may be left unread on the socket: it must not be reused.
            await connection.disconnect()
            if isinstance(exc, rex.AskError) or (
                isinstance(exc, rex.ResponseError) and str(exc).startswith(("MOVED", "ASK "))
            ):
                # The slot moved: a command through the cluster client follows the
                # redirection and refreshes its slot table for the next call.
                with (
                    anyio.CancelScope(shield=True),
                    anyio.move_on_after(5),
                    contextlib.suppress(rex.RedisError, OSError),
                ):
                    await self.client.exists(key)
            raise
        finally:
            _release(node, connection)
        return _exec_replies(replies)

    async def _claim(
        self, lock: str, stream: str, token: str, consumer: str, count: int, ack: Sequence[str]
    ) -> ReadReply:
        r = await self.scripts.claim(
            keys=[lock, stream], args=[token, self.keys.group, consumer, count, *ack]
        )
        if int(r[0]) != 1:
            return NOT_OWNED
        ids = [text(i) for i in r[1]]
        if not ids:
            return ReadReply(True, "0-0", [])
        batch, largest = sized_entries(await self._fetch_claimed(stream, ids))
        return ReadReply(True, "0-0", batch, largest, claimed=True)

    async def _fetch_claimed(self, stream: str, ids: Sequence[str]) -> list[Any]:
        """The entries of claimed ``ids`` (ascending, as XAUTOCLAIM gives them), in order;
        one deleted since is left out.

        One XRANGE over their span, whose entries acked in between are dropped; only ids
        its COUNT cut off are fetched one by one. An owner's pending entries are mostly
        one read's batch, so a successor claiming 40 of them sends one command, not 40.
        """
        wanted = set(ids)
        limit = len(ids) + _CLAIM_SPAN_SLACK
        span = await self.client.xrange(stream, ids[0], ids[-1], count=limit)
        found = {text(item[0]): item for item in span if text(item[0]) in wanted}
        rest: list[str] = []
        if len(span) >= limit:  # cut off: what lies past its last entry, one by one
            last = id_order(text(span[-1][0]))
            rest = [i for i in ids if i not in found and id_order(i) > last]
        if rest:
            async with self.client.pipeline(transaction=False) as pipe:
                for entry_id in rest:
                    pipe.xrange(stream, entry_id, entry_id, count=1)
                for reply in await pipe.execute():
                    if reply:
                        found[text(reply[0][0])] = reply[0]
        return [found[i] for i in ids if i in found]

    @blocking
    async def wait_for_entries(self, stream: str, after_id: str, block_ms: int) -> None:
        """Block until ``stream`` has an entry newer than ``after_id`` or ``block_ms`` pass.

        A plain XREAD changes no consumer-group state, so a stalled owner that wakes up
        here pulls nothing into its pending list.
        """
        await self.client.xread({stream: after_id}, count=1, block=block_ms)

    @script
    async def release(self, stream: str, token: str, keep_ms: int, ack: Sequence[str] = ()) -> bool:
        """Fenced final ack, unlock, and retention (-1 keep, 0 delete, >0 PEXPIRE ms)."""
        r = await self.scripts.release(
            keys=[self.keys.lock(stream), stream], args=[token, self.keys.group, keep_ms, *ack]
        )
        return int(r) == 1

    @script
    async def seal(
        self,
        stream: str,
        token: str,
        keep_ms: int,
        ack: Sequence[str] = (),
        *,
        cancelled: bool = False,
        job: str = "",
    ) -> bool:
        """Fenced final acks and retention of a finishing stream; the lock stays held.

        ``cancelled``: the job ended early: also ack every entry still pending in the
        group, move the group to the stream's end and mark ``job`` ended
        (docs/design.md#job-identity). The cancel marker goes either way.
        """
        r = await self.scripts.seal(
            keys=[
                self.keys.lock(stream), stream, self.keys.cancel(stream), self.keys.ended(stream),
            ],
            args=[
                token, self.keys.group, keep_ms, "cancel" if cancelled else "", job,
                ENDED_MARKER_TTL_MS, *ack,
            ],
        )  # fmt: skip
        return int(r) == 1

    @translated
    async def is_end_marker(self, stream: str, entry_id: str) -> bool:
        """True if entry ``entry_id`` of ``stream`` is the end-of-stream marker."""
        reply = await self.client.xrange(stream, entry_id, entry_id, count=1)
        if not reply:
            return False
        return is_eos({text(k): text(v) for k, v in (reply[0][1] or {}).items()})

    @translated
    async def lock_exists(self, stream: str) -> bool:
        return int(await self.client.exists(self.keys.lock(stream))) == 1

    async def lock_alive(self, stream: str) -> bool:
        """Whether ``stream``'s lock exists and, if it names a session, that session is
        alive (two reads: the lock is in the stream's slot, the session in the
        service's). A dead session never comes back, so False stays true."""
        return (await self.lock_state(stream))[0]

    async def lock_state(self, stream: str) -> tuple[bool, str | None]:
        """``(alive, dead token)``: whether the lock is alive (:meth:`lock_alive`), and
        the token of a lock that exists but names a dead session (else None)."""
        holder = await self.lock_holder(stream)
        if holder is None:
            return False, None
        parsed = parse_session_token(holder)
        if parsed is None:
            return True, None
        if await self.session_alive(parsed.consumer, parsed.incarnation, parsed.service):
            return True, None
        return False, holder

    @translated
    async def session_alive(
        self, consumer: str, incarnation: str, service: str | None = None
    ) -> bool:
        """Whether ``consumer``'s session key exists and holds ``incarnation``.

        ``service`` is the consumer's service when it is not this gateway's (a lock
        token of another service under the same prefix names its own).
        """
        keys = self.keys
        if service is not None and service != keys.service:
            keys = Keys(service, keys.prefix)
        value = await self.client.get(keys.session(consumer))
        return incarnation_of(None if value is None else text(value)) == incarnation

    @script
    async def session(
        self, mode: SessionMode, consumer: str, value: str, ttl_ms: int, incarnation: str
    ) -> bool:
        """session.lua: create, renew, end or forget one incarnation of ``consumer``'s
        session (``value`` is the incarnation itself for 'forget')."""
        r = await self.scripts.session(
            keys=[self.keys.session(consumer), self.keys.sessions],
            args=[mode, value, ttl_ms, session_member(incarnation, consumer)],
        )
        return int(r) == 1

    @script
    async def next_due_ms(self) -> int | None:
        """Milliseconds (server time) until the earliest lease or session deadline; 0 if
        one has passed; None if there is none."""
        r = int(await self.scripts.next_due(keys=[self.keys.leases, self.keys.sessions]))
        return None if r < 0 else r

    @script
    async def sweep_sessions(self, limit: int, recheck_ms: int) -> list[tuple[str, int]]:
        """Claim due session index members: (member, its deadline in server ms) each."""
        r = await self.scripts.sweep(keys=[self.keys.sessions], args=[0, limit, recheck_ms])
        return [(text(r[i]), int(float(text(r[i + 1])))) for i in range(0, len(r), 2)]

    @translated
    async def lock_and_cancel(self, stream: str) -> tuple[str | None, str | None]:
        """The token in ``stream``'s lock and the reason in its cancel marker (None where
        there is none): one MGET, both keys being in the stream's slot."""
        token, reason = await self.client.mget(self.keys.lock(stream), self.keys.cancel(stream))
        return (None if token is None else text(token), None if reason is None else text(reason))

    @translated
    async def lock_holder(self, stream: str) -> str | None:
        """The token in ``stream``'s lock, or None if there is no lock."""
        token = await self.client.get(self.keys.lock(stream))
        return None if token is None else text(token)

    @script
    async def sweep_leases(
        self, horizon_ms: int, limit: int, recheck_ms: int
    ) -> list[tuple[str, int]]:
        """Claim due leases: (assignment id, its deadline in server ms) each."""
        r = await self.scripts.sweep(keys=[self.keys.leases], args=[horizon_ms, limit, recheck_ms])
        return [(text(r[i]), int(float(text(r[i + 1])))) for i in range(0, len(r), 2)]

    @script
    async def prune_consumers(self, min_idle_ms: int, keep: str) -> list[str]:
        """Delete assignment-group consumers with nothing pending, idle ``min_idle_ms``."""
        r = await self.scripts.prune_consumers(
            keys=[self.keys.assignments],
            args=[self.keys.group, min_idle_ms, keep, self.keys.session_prefix],
        )
        return [text(name) for name in r]

    @translated
    async def touch_session(self, consumer: str, value: str, ttl_ms: int) -> None:
        """Mark ``consumer`` alive for ``ttl_ms`` (its heartbeat renews it)."""
        await self.client.set(self.keys.session(consumer), value, px=ttl_ms)

    @translated
    async def end_session(self, consumer: str) -> None:
        """``consumer`` stopped: its name may be pruned at once."""
        await self.client.delete(self.keys.session(consumer))

    @translated
    async def unblock(self, client_id: int) -> bool:
        """CLIENT UNBLOCK: end the blocking read of connection ``client_id`` now."""
        return int(await self.client.execute_command("CLIENT", "UNBLOCK", client_id)) == 1

    @translated
    async def take_scan_lease(self, owner: str, ttl_ms: int) -> bool:
        """SET NX PX: True if ``owner`` runs the reconciliation scan for ``ttl_ms``."""
        return bool(await self.client.set(self.keys.scan_lease, owner, nx=True, px=ttl_ms))

    @translated
    async def scan_cursor(self) -> str:
        """Where the next scan pass starts in the pending list ('-': the beginning)."""
        cursor = await self.client.get(self.keys.scan_cursor)
        return "-" if cursor is None else text(cursor)

    @translated
    async def save_scan_cursor(self, cursor: str) -> None:
        # Kept a day: a service that stops for longer starts its next round afresh.
        await self.client.set(self.keys.scan_cursor, cursor, px=_CURSOR_KEEP_MS)


class BlockingReader:
    """One connection of the client's pool, held for multi-key ``XREAD BLOCK`` calls.

    Standalone clients only (a cluster refuses keys of several slots in one command).
    Its ``CLIENT ID`` lets another connection end a read early (``CLIENT UNBLOCK``).
    """

    def __init__(self, client: Any) -> None:
        self._pool = client.connection_pool
        self._connection: Any = None
        self.client_id: int | None = None

    @translated
    async def open(self) -> None:
        try:
            self._connection = await self._pool.get_connection()
        except TypeError:  # redis-py before 5.3 wants a command name
            self._connection = await self._pool.get_connection("XREAD")
        await self._connection.send_command("CLIENT", "ID")
        self.client_id = int(await self._connection.read_response())

    @translated
    async def read(self, after: Mapping[str, str], block_ms: int) -> list[str]:
        """Block until one of ``after``'s streams has an entry newer than its id, or
        ``block_ms`` pass, or ``CLIENT UNBLOCK``; returns the streams that have one."""
        connection = self._connection
        assert connection is not None, "open() first"
        await connection.send_command(
            "XREAD", "COUNT", 1, "BLOCK", block_ms, "STREAMS", *after.keys(), *after.values()
        )
        reply = await connection.read_response()
        if isinstance(reply, dict):  # RESP3
            return [text(name) for name in reply]
        return [text(item[0]) for item in reply or ()]

    @translated
    async def missing(self, keys: Sequence[str]) -> list[str]:
        """Those of ``keys`` that do not exist: one ``EXISTS`` over all of them, and
        only if some are gone, one per key (pipelined) to say which."""
        connection = self._connection
        assert connection is not None, "open() first"
        if not keys:
            return []
        await connection.send_command("EXISTS", *keys)
        if int(await connection.read_response()) == len(keys):
            return []
        await connection.send_packed_command(
            connection.pack_commands([("EXISTS", key) for key in keys])
        )
        found = [int(await connection.read_response()) for _ in keys]
        return [key for key, n in zip(keys, found, strict=True) if n == 0]

    async def close(self) -> None:
        connection, self._connection, self.client_id = self._connection, None, None
        if connection is not None:
            with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
                await connection.disconnect()  # a read may be in flight: never reuse it
                await self._pool.release(connection)


def is_tls_failure(exc: BaseException) -> bool:
    """True if ``exc``, or what it was raised from, is a handshake error or a timeout;
    False if a server answered (a wrong password is no TLS problem)."""
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in chain:
        chain.append(current)
        current = current.__cause__ or current.__context__
    if any(isinstance(e, rex.AuthenticationError | rex.ResponseError) for e in chain):
        return False
    return any(
        isinstance(e, ssl.SSLError | TimeoutError | rex.TimeoutError)
        or (isinstance(e, rex.ConnectionError) and "SSL" in str(e))
        for e in chain
    )


# -- administrative commands on any client -------------------------------------------


@translated
async def ping(client: Any) -> None:
    await client.ping()


@translated
async def get_config(client: Any, name: str) -> str:
    """``CONFIG GET name`` ('' if unset)."""
    reply = await client.config_get(name)
    return text(reply.get(name, "") or "")


@translated
async def eviction_policies(client: Any) -> list[str]:
    """``maxmemory_policy`` from ``INFO memory`` (allowed where CONFIG is not), of
    the server, or of every primary of a cluster."""
    if hasattr(client, "get_primaries"):
        reply = await client.info("memory", target_nodes=client.PRIMARIES)
        infos = list(reply.values()) if isinstance(reply, dict) else [reply]
        if infos and not isinstance(infos[0], dict):  # one node answered, unwrapped
            infos = [reply]
    else:
        infos = [await client.info("memory")]
    return [text(info.get("maxmemory_policy", "")) for info in infos if isinstance(info, dict)]


@translated
async def set_config(client: Any, name: str, value: str) -> None:
    await client.config_set(name, value)


def parse_slots(reply: Any) -> SlotMap:
    """CLUSTER SLOTS in either redis-py shape (raw list, or parsed dict)."""
    out: SlotMap = {}
    if isinstance(reply, dict):
        for (lo, hi), info in reply.items():
            host, port = info["primary"][:2]
            out[(int(lo), int(hi))] = (text(host), int(port))
        return out
    for item in reply or ():
        lo, hi, primary = item[0], item[1], item[2]
        out[(int(lo), int(hi))] = (text(primary[0]), int(primary[1]))
    return out


@translated
async def cluster_state(node: Any) -> tuple[str, SlotMap]:
    """``cluster_state`` and the slot map, as one node sees them (pure reads)."""
    info = await node.execute_command("CLUSTER INFO")
    slots = await node.execute_command("CLUSTER SLOTS")
    state = info.get("cluster_state") if isinstance(info, dict) else None
    if state is None:
        state = "ok" if "cluster_state:ok" in text(info) else "fail"
    return text(state), parse_slots(slots)


def client_db(client: Any) -> int:
    """The database number a client talks to (a cluster client's ``db`` too, 0 if it
    has none)."""
    pool = getattr(client, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", None) or getattr(client, "connection_kwargs", {})
    return int((kwargs or {}).get("db", 0) or 0)
