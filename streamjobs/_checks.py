"""The checks both consumer kinds make at construction, one function per rule: each
raises :class:`~streamjobs.ConfigurationError` naming the setting at fault."""

from __future__ import annotations

import inspect
import os
import secrets
import socket
from dataclasses import dataclass
from typing import Any, get_args, get_origin

from ._pipeline import handler_kind_problem
from ._waiter import SHARD_STREAMS
from .config import ClusterMode, ConsumerConfig
from .exceptions import ConfigurationError


def default_consumer_name() -> str:
    """``host-pid-random``: unique to each consumer instance."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


def check_client(redis: Any) -> None:
    """The client must hand back bytes: entries may hold any bytes."""
    get_encoder = getattr(redis, "get_encoder", None)
    if get_encoder is not None and getattr(get_encoder(), "decode_responses", False):
        raise ConfigurationError(
            "redis",
            "a client made with decode_responses=True cannot read entries holding "
            "non-UTF-8 bytes: create it with decode_responses=False (the default); "
            "streamjobs decodes what it hands to handle() itself",
        )


_BLOCK_MARGIN_S = 0.5
"""A blocking read must end this long before the client's socket timeout would."""


def _socket_timeout(redis: Any) -> float | None:
    """The ``socket_timeout`` the client's connections will use (standalone or cluster
    client), if they have one.

    The pool's settings can miss it: ``Redis.from_url()`` in redis-py 8 leaves it out
    of ``connection_kwargs``, and the connection class then applies its own default
    (5 s). So a setting that is absent is read from the connection class's signature.
    """
    pool = getattr(redis, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", None) or getattr(redis, "connection_kwargs", {})
    kwargs = kwargs or {}
    if "socket_timeout" in kwargs:
        value = kwargs["socket_timeout"]
    else:
        connection_class = getattr(pool, "connection_class", None) or kwargs.get("connection_class")
        value = _default_of(connection_class, "socket_timeout")
    return float(value) if isinstance(value, int | float) and value > 0 else None


def _default_of(cls: Any, parameter: str) -> Any:
    """The default of ``parameter`` in the first ``__init__`` along ``cls``'s MRO that
    declares it (None if none does): what an instance built without it would get."""
    for klass in getattr(cls, "__mro__", ()):
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        try:
            found = inspect.signature(init).parameters.get(parameter)
        except (TypeError, ValueError):
            continue
        if found is not None:
            return None if found.default is inspect.Parameter.empty else found.default
    return None


def check_block(redis: Any, config: ConsumerConfig) -> None:
    """``read_block_ms`` must end blocking reads before the client gives up on them:
    otherwise every idle read times out, and is retried as a Redis failure."""
    timeout_s = _socket_timeout(redis)
    if timeout_s is None:
        return
    if config.read_block_ms / 1000 + _BLOCK_MARGIN_S > timeout_s:
        raise ConfigurationError(
            "read_block_ms",
            f"must be at most the client's socket_timeout ({timeout_s:g}s) minus "
            f"{_BLOCK_MARGIN_S:g}s, i.e. <= {max(0, int((timeout_s - _BLOCK_MARGIN_S) * 1000))}"
            f", got {config.read_block_ms}: a blocking read would time out on the client; "
            "lower read_block_ms or raise the client's socket_timeout",
        )


def check_cluster_mode(redis: Any, cluster_mode: ClusterMode) -> None:
    """``cluster_mode`` must match the client: a cluster client for ``OSS``."""
    if not isinstance(cluster_mode, ClusterMode):
        raise ConfigurationError("cluster_mode", "must be a ClusterMode")
    is_cluster_client = hasattr(redis, "get_primaries")
    if cluster_mode is ClusterMode.OSS and not is_cluster_client:
        raise ConfigurationError(
            "cluster_mode", "ClusterMode.OSS needs a redis.asyncio.RedisCluster client"
        )
    if cluster_mode is ClusterMode.NONE and is_cluster_client:
        raise ConfigurationError(
            "cluster_mode", "a RedisCluster client needs ClusterMode.OSS (or PROXY)"
        )


def consumer_name_of(given: str | None) -> str:
    """The consumer's name: ``given``, or ``host-pid-random``; non-empty, no whitespace."""
    name = given or default_consumer_name()
    if not name or any(c.isspace() for c in name):
        raise ConfigurationError("consumer_name", "must be non-empty, without whitespace")
    return name


@dataclass(frozen=True, slots=True)
class PoolNeed:
    """The connections a consumer holds at once, and which setting sets how many of
    them its streams take."""

    slots: int
    """Command slots (``redis_concurrency``)."""
    fixed: int
    """Connections held outside the slots whatever the streams (the command channel's,
    intake, a spare, ...)."""
    shards: int = 0
    """Shared blocking reads of the idle wait (one per ``SHARD_STREAMS`` streams)."""
    per_stream: int = 0
    """Streams that each block on a connection of their own while idle."""
    streams: int = 0
    streams_field: str = "max_concurrent_streams"
    """The setting that sets how many streams wait (its name in the error)."""

    @property
    def needed(self) -> int:
        return self.slots + self.fixed + self.shards + self.per_stream


def check_pool(redis: Any, need: PoolNeed) -> None:
    """The client's pool must hold every connection of ``need``: a smaller pool runs out
    under load (``MaxConnectionsError``), and the consumer loses its own work. The
    error blames the streams if the pool holds the slots and at least one stream's
    connection, else ``redis_concurrency``."""
    pool = getattr(redis, "connection_pool", None)
    limit = getattr(pool, "max_connections", None)
    if limit is None:  # a cluster client: its per-node pools
        limit = (getattr(redis, "connection_kwargs", None) or {}).get("max_connections")
    needed = need.needed
    if not isinstance(limit, int) or limit >= needed:
        return
    create = f"create the client with max_connections>={needed}"
    room = limit - need.slots - need.fixed  # connections left for the waiting streams
    if room >= 1 and need.shards:
        fits = min(need.streams, room * SHARD_STREAMS)
        raise ConfigurationError(
            need.streams_field,
            f"{need.streams} streams wait for entries on {need.shards} shared blocking "
            f"reads (one per {SHARD_STREAMS} streams), so with redis_concurrency="
            f"{need.slots} the consumer needs {needed} connections, but the client's pool "
            f"allows {limit}: {create}, or lower {need.streams_field} to {fits}",
        )
    if room >= 1 and need.per_stream:
        raise ConfigurationError(
            need.streams_field,
            f"{need.per_stream} streams need {needed} connections (one per stream waiting "
            f"for entries, plus redis_concurrency={need.slots} and {need.fixed}), but the "
            f"client's pool allows {limit}: {create}, or lower {need.streams_field} to "
            f"{room}",
        )
    raise ConfigurationError(
        "redis_concurrency",
        f"{need.slots} commands in flight plus {needed - need.slots} other connections "
        f"need {needed}, but the client's pool allows {limit}: {create}, or lower "
        "redis_concurrency",
    )


def declared_field_type(cls: type, kind: type) -> type[str] | type[bytes] | None:
    """The type ``cls`` declares its entries' fields as, from the first parameterised
    ``kind`` base along its MRO (``class C(StreamConsumer[bytes])``); None if none names
    a concrete type (``str`` is the default)."""
    for klass in cls.__mro__:
        for base in klass.__dict__.get("__orig_bases__", ()):
            origin = get_origin(base)
            if isinstance(origin, type) and issubclass(origin, kind):
                args = get_args(base)
                if args and args[0] in (str, bytes):
                    return args[0]  # type: ignore[no-any-return]
    return None


def check_subclass(cls: Any, kind: type) -> None:
    """A consumer subclass: its ``fields_type`` (declared as ``Kind[bytes]``, or set)
    is str or bytes, and its ``handle`` can be called as a handler."""
    declared = declared_field_type(cls, kind)
    if declared is not None and "fields_type" not in cls.__dict__:
        cls.fields_type = declared
    if cls.fields_type not in (str, bytes):
        raise ConfigurationError(
            "fields_type",
            f"{cls.__qualname__}.fields_type must be str or bytes, got {cls.fields_type!r}",
        )
    handle = cls.__dict__.get("handle")
    problem = None if handle is None else handler_kind_problem(handle)
    if problem is not None:
        raise ConfigurationError(
            "handle",
            f"{cls.__qualname__}.handle is {problem}: define it as "
            "'async def handle(self, message)' or a plain 'def handle(self, message)'",
        )
