"""The Redis boundary's core: error translation, the command decorators, the raw
transaction (see :mod:`streamjobs._redis`; reply decoding is :mod:`._replies`)."""

from __future__ import annotations

import contextlib
import contextvars
import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from typing import Any, Literal, ParamSpec, Protocol, TypeVar

import anyio
from redis import exceptions as rex

from .._keys import Keys
from ..exceptions import (
    EntryTooLarge as EntryTooLarge,  # the boundary's to raise; importers find it here
)
from ..exceptions import (
    NoSuchGroup,
    PermissionDenied,
    RedisCommandError,
    RedisUnavailable,
    ScriptError,
    StreamJobsError,
    WrongKeyType,
)
from ..exceptions import (
    UnexpectedClientError as UnexpectedClientError,
)
from ._channel import Channel, release_to_node
from ._replies import raw_sized_entries as raw_sized_entries  # tests import it from here
from ._scripts import Scripts

P = ParamSpec("P")
T = TypeVar("T")

LostAt = int | Literal["lease"] | None
"""When a re-queued assignment's previous owner was lost (see ``Gateway.requeue``)."""
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
``dead_letter_entry.lua``: a script copying a 50 MB entry ran for 225-353 ms."""

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


def _core_of(target: Any) -> Core | None:
    """The gateway a decorated method runs on: the one its command group (a
    ``gateway.<group>``) names as its ``core``; None for a module function, whose
    first argument is a client."""
    core: Core | None = getattr(target, "core", None)
    return core


def _translating(
    in_script: bool, *, limited: bool | Literal["off-channel"] = True
) -> Callable[[Callable[P, Awaitable[T]]], Callable[P, Coroutine[Any, Any, T]]]:
    def decorate(fn: Callable[P, Awaitable[T]]) -> Callable[P, Coroutine[Any, Any, T]]:
        async def call(*args: P.args, **kwargs: P.kwargs) -> T:
            core = _core_of(args[0]) if args else None
            try:
                if args:  # the gateway's client, or the client a module function takes
                    await _initialized(core.client if core is not None else args[0])
                result = await fn(*args, **kwargs)
            except (rex.RedisError, rex.RedisClusterException, OSError) as exc:
                raise translate(exc, in_script=in_script) from exc
            except StreamJobsError:
                raise
            except Exception as exc:
                raise UnexpectedClientError(f"{type(exc).__name__}: {exc}") from exc
            if core is not None:
                core.last_ok = time.monotonic()  # readiness: Redis answered
            return result

        @functools.wraps(fn)
        async def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
            # A gateway method takes one of its consumer's command slots (nested
            # calls of the same task reuse it), so the connections a consumer opens
            # stay bounded however many of its streams act at once.
            owner = (_core_of(args[0]) or args[0]) if args else None
            limiter = getattr(owner, "limiter", None) if limited else None
            if limited == "off-channel":
                channel = getattr(owner, "channel", None)
                if channel is not None:  # its commands share the channel's connections
                    async with channel.room:
                        return await call(*args, **kwargs)
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
channelled = _translating(in_script=True, limited="off-channel")
"""Decorator: like :func:`script`, for a coroutine whose commands go on the command
channel when the gateway has one, so it takes no command slot then: the channel's
connections do not grow with the commands in flight. What such a coroutine sends
elsewhere (a large read) takes a slot itself (``Core.slot``)."""
channelled_command = _translating(in_script=False, limited="off-channel")
"""Decorator: like :func:`channelled`, for a coroutine of plain commands."""
blocking = _translating(in_script=False, limited=False)
"""Decorator: like :func:`translated`, for a blocking read, which takes no command
slot (a long wait must not starve the others; the pool check counts these)."""


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


class Core(Protocol):
    """What a command group of the gateway uses of it (:class:`~streamjobs._redis.
    Gateway` is the core; each group holds it as ``core``)."""

    client: Any
    keys: Keys
    limiter: anyio.CapacityLimiter | None
    dlq: str
    dlq_maxlen: int
    max_copy_values: int
    scripts: Scripts
    is_cluster: bool
    last_ok: float | None
    raw_fields: bool
    """Data entries keep their fields as bytes (a consumer in bytes mode)."""

    @property
    def channel(self) -> Channel | None: ...
    def slot(self) -> contextlib.AbstractAsyncContextManager[None]: ...
    async def command(self, key: str, *command: Any, large: bool = False) -> Any: ...
    async def transaction(
        self, key: str, commands: Sequence[tuple[Any, ...]], *, large: bool = False
    ) -> list[Any]: ...


@contextlib.asynccontextmanager
async def command_slot(limiter: anyio.CapacityLimiter | None) -> AsyncIterator[None]:
    """Hold one of a consumer's command slots (one the task holds already is reused),
    for a command sent outside the channel from a channelled method."""
    if limiter is None or _HOLDING.get():
        yield
        return
    async with limiter:
        token = _HOLDING.set(True)
        try:
            yield
        finally:
            _HOLDING.reset(token)


async def pool_transaction(client: Any, key: str, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
    """MULTI, ``commands``, EXEC raw over one connection of ``client``'s pool (on a
    cluster, of the primary that holds ``key``'s slot); error replies in place."""
    if not hasattr(client, "get_node_from_key"):
        pool = client.connection_pool
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
    node = client.get_node_from_key(key)
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
                await client.exists(key)
        raise
    finally:
        release_to_node(node, connection)
    return _exec_replies(replies)


def exec_replies(replies: Any) -> list[Any]:
    """The replies of an EXEC (see :func:`_exec_replies`)."""
    return _exec_replies(replies)
