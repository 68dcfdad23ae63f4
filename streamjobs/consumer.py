"""StreamConsumer: subclass it, implement ``handle()``, run it.

The class is the user's contract and nothing more: ``handle()``, three optional
hooks, and ``@final`` framework methods. Everything that runs lives in a private
runtime object held under one name-mangled attribute, so a subclass may use any
attribute or method name of its own (``_config``, ``_run``, ``_redis``, ...) without
breaking the framework.
"""

from __future__ import annotations

import abc
import inspect
import os
import secrets
import socket
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, ClassVar, Generic, final, get_args, get_origin

import anyio
import anyio.abc

from ._keys import Keys
from ._pipeline import handler_kind_problem
from ._redis import Gateway
from ._runtime import Runtime
from ._stats import ConsumerStatistics
from ._waiter import SHARD_STREAMS, shard_count
from .config import ClusterMode, ConsumerConfig, RecoveryConfig, default_min_idle_s
from .exceptions import ConfigurationError
from .message import F, Message
from .metrics import MetricsRecorder, NullRecorder, RequeueOutcome


def _default_consumer_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


def _check_client(redis: Any) -> None:
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


def _check_block(redis: Any, config: ConsumerConfig) -> None:
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


_BLOCKING_CONNECTIONS = 4
"""Connections held outside the command slots: intake, the shared idle wait (its first
shard), the keyspace subscription, and the command channel's (one per node)."""


def _check_pool(redis: Any, config: ConsumerConfig, cluster_mode: ClusterMode) -> None:
    """The client's pool must hold the consumer's command slots
    (``redis_concurrency``) and its blocking connections: on a standalone server one
    per shard of the shared idle wait (one per 1,250 ``max_concurrent_streams``, at
    most 16); without the shared idle wait (a cluster, or a proxy) each owned stream
    blocks on a connection of its own. A smaller pool runs out under load
    (``MaxConnectionsError``) and the consumer loses its own streams."""
    pool = getattr(redis, "connection_pool", None)
    limit = getattr(pool, "max_connections", None)
    if limit is None:  # a cluster client: its per-node pools
        limit = (getattr(redis, "connection_kwargs", None) or {}).get("max_connections")
    per_stream = cluster_mode is not ClusterMode.NONE
    base = config.redis_concurrency + _BLOCKING_CONNECTIONS
    shards = 0 if per_stream else shard_count(config.max_concurrent_streams)
    needed = base + (config.max_concurrent_streams if per_stream else shards - 1)
    if not isinstance(limit, int) or limit >= needed:
        return
    if not per_stream and limit >= base:
        fits = min(config.max_concurrent_streams, (limit - base + 1) * SHARD_STREAMS)
        raise ConfigurationError(
            "max_concurrent_streams",
            f"{config.max_concurrent_streams} streams wait for entries on {shards} "
            f"shared blocking reads (one per {SHARD_STREAMS} streams), so with "
            f"redis_concurrency={config.redis_concurrency} the consumer needs {needed} "
            f"connections, but the client's pool allows {limit}: create the client with "
            f"max_connections>={needed}, or lower max_concurrent_streams to {fits}",
        )
    if per_stream:
        rule = (
            f"{config.max_concurrent_streams} streams need {needed} connections (one per "
            f"stream waiting for entries, plus redis_concurrency={config.redis_concurrency}"
            f" and {_BLOCKING_CONNECTIONS}), but the client's pool allows {limit}: create "
            f"the client with max_connections>={needed}, or lower max_concurrent_streams "
            f"to {max(1, limit - config.redis_concurrency - _BLOCKING_CONNECTIONS)}"
        )
        raise ConfigurationError("max_concurrent_streams", rule)
    raise ConfigurationError(
        "redis_concurrency",
        f"{config.redis_concurrency} commands in flight plus {needed - config.redis_concurrency} "
        f"blocking connections need {needed}, but the client's pool allows {limit}: "
        f"create the client with max_connections>={needed}, or lower redis_concurrency",
    )


def _check_cluster_mode(redis: Any, cluster_mode: ClusterMode) -> None:
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


def _field_type(cls: type) -> type[str] | type[bytes] | None:
    """The type ``cls`` declares its entries' fields as, from the first parameterised
    ``StreamConsumer`` base along its MRO (``class C(StreamConsumer[bytes])``); None if
    none names a concrete type (``str`` is the default)."""
    for klass in cls.__mro__:
        for base in klass.__dict__.get("__orig_bases__", ()):
            origin = get_origin(base)
            if isinstance(origin, type) and issubclass(origin, StreamConsumer):
                args = get_args(base)
                if args and args[0] in (str, bytes):
                    return args[0]  # type: ignore[no-any-return]
    return None


class StreamConsumer(abc.ABC, Generic[F]):
    """Base class of a consumer: implement :meth:`handle`.

    ``StreamConsumer`` alone hands ``handle()`` a ``Message[str]``: fields decoded as
    UTF-8. Declared as ``StreamConsumer[bytes]``, it hands ``Message[bytes]``: the
    fields' bytes as Redis holds them, undecoded, which is faster and keeps binary
    payloads as they are (docs/concepts.md#bytes-mode).

    Args:
        redis: a ``redis.asyncio.Redis`` (or ``RedisCluster`` with ``ClusterMode.OSS``).
            The consumer does not close it; handlers reach it as :attr:`redis`.
        service: the service name; consumers of one service share the work.
        config: ownership and processing settings.
        recovery: crash-recovery settings; by default ``RecoveryConfig`` with
            ``min_idle_s`` derived from ``config.lock_ttl_s``.
        cluster_mode: how the Redis deployment is laid out.
        metrics: where events are reported; defaults to :class:`NullRecorder`.
        consumer_name: this consumer's name in the consumer groups; default
            ``host-pid-random`` (unique per process start).

    Raises:
        ConfigurationError: a setting is invalid (names the field).
    """

    def __init__(
        self,
        redis: Any,
        *,
        service: str,
        config: ConsumerConfig | None = None,
        recovery: RecoveryConfig | None = None,
        cluster_mode: ClusterMode = ClusterMode.NONE,
        metrics: MetricsRecorder | None = None,
        consumer_name: str | None = None,
    ) -> None:
        config = config or ConsumerConfig()
        recovery = recovery or RecoveryConfig(min_idle_s=default_min_idle_s(config.lock_ttl_s))
        recovery.check_against(config)
        _check_client(redis)
        _check_block(redis, config)
        _check_pool(redis, config, cluster_mode)
        _check_cluster_mode(redis, cluster_mode)
        keys = Keys(service, config.key_prefix)
        if recovery.dlq_stream is not None:
            keys.check_dlq_name(recovery.dlq_stream)
        name = consumer_name or _default_consumer_name()
        if not name or any(c.isspace() for c in name):
            raise ConfigurationError("consumer_name", "must be non-empty, without whitespace")
        gateway = Gateway(redis, keys, dlq=recovery.dlq_stream, dlq_maxlen=recovery.dlq_maxlen)
        gateway.raw_fields = type(self).fields_type is bytes
        self.__runtime = Runtime(
            self,
            gateway,
            client=redis,
            name=name,
            config=config,
            recovery=recovery,
            cluster_mode=cluster_mode,
            metrics=metrics or NullRecorder(),
        )

    # -- the subclass contract -------------------------------------------------------

    fields_type: ClassVar[type[str] | type[bytes]] = str
    """What ``handle()`` gets field names and values as: set from the class's
    declaration (``StreamConsumer[bytes]``), or by a subclass itself."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        declared = _field_type(cls)
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

    @abc.abstractmethod
    def handle(self, message: Message[F]) -> Awaitable[None] | None:
        """Process one entry. Called in order within a stream, concurrently across streams.

        Define it as ``async def handle(self, message)``, or as a plain
        ``def handle(self, message)`` for blocking code: that runs in a worker thread
        (at most 40 at once per consumer), with the same retries, timeout and dead
        letters. A plain handler past ``handler_timeout_s`` is no longer waited for,
        but its thread runs on until it returns.

        Return to have the entry acknowledged. Raise `Retry` to retry after a
        delay, `DeadLetter` to dead-letter it now, or any other exception to
        retry with backoff up to ``max_handler_attempts`` (then it is dead-lettered
        with reason ``handler_failed`` and the next entry follows).
        """

    async def on_startup(self) -> None:
        """Called once by :meth:`run`, once Redis answered and before the first read:
        open what the handlers need (a database pool, an HTTP client) here, not in
        ``__init__``. If it raises, ``run()`` raises :class:`HookFailed` and nothing
        is acquired; :meth:`on_shutdown` is still called."""

    async def on_shutdown(self) -> None:
        """Called once at the end of :meth:`run`, after every stream was handed back or
        finished and no handler runs any more; also after a start that failed, so
        that what :meth:`on_startup` opened is closed. If it raises, ``run()`` raises
        :class:`HookFailed` (unless it is already raising another error)."""

    async def on_stream_start(self, stream: str, info: Mapping[str, Any]) -> None:
        """Called once the stream's lock is held, before its first entry is handled."""

    async def on_stream_end(self, stream: str) -> None:
        """Called after the stream finished (end marker handled, assignment completed)."""

    async def on_stream_lost(self, stream: str) -> None:
        """Called when the lock was lost (expired or taken over): no more of its entries
        reach ``handle()`` here, and nothing more of it is acknowledged by this consumer."""

    async def on_stream_cancelled(self, stream: str, reason: str) -> None:
        """Called once a stream was cancelled (``Producer.cancel_stream``): no more of
        its entries reach ``handle()`` (the rest are discarded), its assignment is done
        and its lock released. Called instead of :meth:`on_stream_end`."""

    # -- public framework API ---------------------------------------------------------

    @final
    @property
    def service(self) -> str:
        return self.__runtime.service

    @final
    @property
    def consumer_name(self) -> str:
        return self.__runtime.name

    @final
    @property
    def redis(self) -> Any:
        """The Redis client this consumer was built with, for a handler's own commands.

        It is the same object that was passed in (``Redis`` or ``RedisCluster``); the
        consumer never closes it. Keys a handler writes are its own business: name
        them so they cannot collide with the service's (docs/design.md#keys).
        """
        return self.__runtime.client

    @final
    @property
    def owned_streams(self) -> frozenset[str]:
        """Names of the streams this consumer currently holds the lock of."""
        return self.__runtime.owned_streams()

    @final
    def statistics(self) -> ConsumerStatistics:
        """A frozen snapshot: owned streams, handlers in flight, the last Redis reply
        and scanner pass, health and readiness, and counts of what happened."""
        return self.__runtime.statistics()

    @final
    async def wait_ready(self) -> None:
        """Wait until :meth:`run` has started all its loops."""
        await self.__runtime.wait_ready()

    @final
    def finish(self, stream: str) -> None:
        """Finish ``stream`` after the current entry, as if its end marker had been read."""
        self.__runtime.finish(stream)

    @final
    async def claim(self, assignment_id: str) -> RequeueOutcome:
        """Recover one pending assignment now (the primitive the scanner uses).

        The lock of its stream must be gone (``OWNER_ALIVE`` otherwise). The result is
        that the assignment is re-queued for whichever consumer reads it next, or
        dead-lettered; this consumer does not take it directly.
        """
        return await self.__runtime.claim(assignment_id)

    @final
    async def reset_topology(self) -> None:
        """Re-discover the cluster's primaries and rebuild keyspace subscriptions.

        ``ClusterMode.OSS`` only (a no-op otherwise): checks the cluster is settled
        (every reachable node ``cluster_state:ok`` and agreeing on slot owners),
        refreshes the client's slot map, re-applies keyspace configuration on the
        current primaries and rebuilds subscriptions, exactly one per primary. The
        consumer also does this by itself when a subscription dies or the primary set
        changes; this hook is for operators.

        Raises:
            ClusterNotSettled: the cluster is mid-failover or resharding; nothing changed.
        """
        await self.__runtime.reset_topology()

    @final
    async def aclose(self) -> None:
        """Stop gracefully and wait until :meth:`run` returned.

        Intake stops, in-flight handlers get ``shutdown_grace_s`` to finish, and every
        unfinished stream is handed back for another consumer to resume at once.
        """
        await self.__runtime.aclose()

    @final
    async def __aenter__(self) -> StreamConsumer[F]:
        await self.__runtime.enter(self.run)
        return self

    @final
    async def __aexit__(self, *exc: object) -> None:
        await self.__runtime.exit()

    @final
    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Consume until :meth:`aclose` is called or this task is cancelled.

        Raises:
            RedisUnavailable: Redis could not be reached at start-up.
        """
        await self.__runtime.run(task_status)


def probes(
    consumer: StreamConsumer,
) -> tuple[Callable[[], tuple[bool, str]], Callable[[], tuple[bool, str]]]:
    """``consumer``'s liveness and readiness checks, callable from any thread (the
    worker's HTTP endpoint); each answers (ok, a one-line reason)."""
    runtime = runtime_of(consumer)
    return runtime.health, runtime.readiness


def runtime_of(consumer: StreamConsumer) -> Runtime:
    """The private runtime of ``consumer``: for this package's white-box tests only."""
    runtime: Runtime = consumer._StreamConsumer__runtime  # type: ignore[attr-defined]
    return runtime
