"""GroupConsumer: many consumers sharing the entries of one stream (docs/shared-groups.md).

The sibling of :class:`~streamjobs.StreamConsumer` for the everyday use of a consumer
group: every consumer of a service reads the same streams, each entry goes to one of
them. The contract is the same (``handle()``, the lifecycle hooks, ``Retry``,
``DeadLetter``), and so is the entry pipeline behind it; what differs is how work is
shared and recovered:

* each consumer holds a session per stream, and a pending entry is taken from it only
  once that session is over (the consumer died, stalled past its TTL, or stopped): a
  slow but live consumer keeps its entries, and a dead one's are claimed within the
  session TTL plus about a second;
* acknowledgements are fenced by the session, so a consumer that wakes after its
  entries were claimed acknowledges none of them.
"""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, ClassVar, Generic, final, get_args, get_origin

import anyio
import anyio.abc

from ._group import GroupRuntime
from ._keys import Keys
from ._pipeline import handler_kind_problem
from ._redis import Gateway
from ._stats import ConsumerStatistics
from ._waiter import shard_count
from .config import (
    ClusterMode,
    ConsumerConfig,
    GroupRetention,
    RecoveryConfig,
    default_min_idle_s,
)
from .consumer import _check_block, _check_client, _check_cluster_mode, _default_consumer_name
from .exceptions import ConfigurationError
from .message import F, Message
from .metrics import MetricsRecorder, NullRecorder, complete

_START_IDS = ("0", "$")


def _field_type(cls: type) -> type[str] | type[bytes] | None:
    for klass in cls.__mro__:
        for base in klass.__dict__.get("__orig_bases__", ()):
            origin = get_origin(base)
            if isinstance(origin, type) and issubclass(origin, GroupConsumer):
                args = get_args(base)
                if args and args[0] in (str, bytes):
                    return args[0]  # type: ignore[no-any-return]
    return None


def _check_pool(redis: Any, config: ConsumerConfig, streams: int, cluster: bool) -> None:
    """The client's pool must hold the consumer's command slots (``redis_concurrency``),
    the command channel's connection, and on a standalone server one shared blocking
    read per 1,250 idle streams. On a cluster idle streams wait on keyspace
    subscriptions, whose connections are not the pool's: a cluster client's default
    pool (100 per node) serves any number of streams. A smaller pool runs out under
    load (``MaxConnectionsError``)."""
    pool = getattr(redis, "connection_pool", None)
    limit = getattr(pool, "max_connections", None)
    if limit is None:
        limit = (getattr(redis, "connection_kwargs", None) or {}).get("max_connections")
    shards = 0 if cluster else shard_count(streams)
    needed = config.redis_concurrency + shards + 2
    if not isinstance(limit, int) or limit >= needed:
        return
    waits = f" and {shards} shared blocking reads for {streams} streams" if shards else ""
    field = "streams" if shards > 1 and limit >= needed - shards + 1 else "redis_concurrency"
    raise ConfigurationError(
        field,
        f"the consumer needs {needed} connections (redis_concurrency="
        f"{config.redis_concurrency} command slots, the command channel's, one spare"
        f"{waits}), but the client's pool allows {limit}: create the client with "
        f"max_connections>={needed}, or lower redis_concurrency"
        + (", or read fewer streams" if field == "streams" else ""),
    )


class GroupConsumer(abc.ABC, Generic[F]):
    """Base class of a shared-group consumer: implement :meth:`handle`.

    Every consumer of ``service`` reads :attr:`streams` in the consumer group named
    after the service; each entry is handed to one of them. Within one consumer,
    a stream's entries are handled in the order read; across consumers there is no
    order. ``GroupConsumer[bytes]`` hands ``Message[bytes]`` (docs/concepts.md#bytes-mode).

    Args:
        redis: a ``redis.asyncio.Redis`` (or ``RedisCluster`` with ``ClusterMode.OSS``).
            The consumer does not close it.
        service: the service name, which is also the consumer group's.
        streams: the streams to read; default the class attribute :attr:`streams`.
        start_id: where the group starts on a stream that has none yet: ``"0"`` (every
            entry already in the stream, the default) or ``"$"`` (only entries
            appended from now on). An existing group keeps its position.
        config: processing settings. ``lock_ttl_s`` is the session TTL: a consumer
            that has not renewed its session for that long is dead, and its pending
            entries go to the others. Heartbeat, batch size, block time, handler
            attempts, backoff, timeout, shutdown grace and key prefix apply as for
            :class:`~streamjobs.StreamConsumer`. ``liveness`` does not apply: a group
            member always holds a session, one per stream
            (docs/shared-groups.md#sessions); the stream-ownership settings
            (``max_concurrent_streams``, ``stream_idle_timeout_s``) neither.
        recovery: ``max_retries`` (deliveries to consumers that died or stopped
            before acknowledging an entry, past which it is dead-lettered),
            ``min_idle_s`` (entries pending under names that hold no session, such
            as other clients of the group, are taken after this idle time),
            ``dlq_stream`` and ``dlq_maxlen``.
        cluster_mode: how the Redis deployment is laid out.
        metrics: where events are reported; defaults to :class:`NullRecorder`.
        consumer_name: this consumer's name; default ``host-pid-random``. Its members
            in the group are this name and an incarnation.
        retention: how the streams are trimmed; by default :class:`GroupRetention`
            (below what every consumer group acknowledged, no cap).

    Raises:
        ConfigurationError: a setting is invalid (names the field).
    """

    streams: ClassVar[Sequence[str]] = ()
    """The streams a subclass reads, unless the constructor's ``streams=`` names others."""

    fields_type: ClassVar[type[str] | type[bytes]] = str
    """What ``handle()`` gets field names and values as (``GroupConsumer[bytes]``)."""

    def __init__(
        self,
        redis: Any,
        *,
        service: str,
        streams: Sequence[str] | None = None,
        start_id: str = "0",
        config: ConsumerConfig | None = None,
        recovery: RecoveryConfig | None = None,
        cluster_mode: ClusterMode = ClusterMode.NONE,
        metrics: MetricsRecorder | None = None,
        consumer_name: str | None = None,
        retention: GroupRetention | None = None,
    ) -> None:
        config = config or ConsumerConfig()
        retention = GroupRetention() if retention is None else retention
        if not isinstance(retention, GroupRetention):
            raise ConfigurationError("retention", "must be a GroupRetention")
        recovery = recovery or RecoveryConfig(min_idle_s=default_min_idle_s(config.lock_ttl_s))
        recovery.check_against(config)
        _check_client(redis)
        _check_block(redis, config)
        _check_cluster_mode(redis, cluster_mode)
        names = type(self).streams if streams is None else streams
        if isinstance(names, str | bytes):
            raise ConfigurationError("streams", "must be a sequence of stream names, not one name")
        chosen = list(dict.fromkeys(names))
        if not chosen:
            raise ConfigurationError(
                "streams",
                "names no stream: set the class attribute 'streams', pass streams=[...], "
                "or give 'streamjobs worker' one --stream NAME per stream",
            )
        if start_id not in _START_IDS:
            raise ConfigurationError(
                "start_id", f"must be '0' (every entry) or '$' (new entries), got {start_id!r}"
            )
        keys = Keys(service, config.key_prefix)
        for stream in chosen:
            if not isinstance(stream, str):
                raise ConfigurationError("streams", f"holds {stream!r}, not a stream name")
            keys.check_data_stream(stream)
        if recovery.dlq_stream is not None:
            keys.check_dlq_name(recovery.dlq_stream)
        _check_pool(redis, config, len(chosen), cluster_mode is not ClusterMode.NONE)
        name = consumer_name or _default_consumer_name()
        if not name or any(c.isspace() for c in name):
            raise ConfigurationError("consumer_name", "must be non-empty, without whitespace")
        gateway = Gateway(redis, keys, dlq=recovery.dlq_stream, dlq_maxlen=recovery.dlq_maxlen)
        gateway.raw_fields = type(self).fields_type is bytes
        self.__runtime = GroupRuntime(
            self,
            gateway,
            client=redis,
            name=name,
            streams=chosen,
            start_id=start_id,
            config=config,
            recovery=recovery,
            metrics=NullRecorder() if metrics is None else complete(metrics),
            cluster=cluster_mode is not ClusterMode.NONE,
            retention=retention,
        )

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
        if isinstance(cls.__dict__.get("streams"), str):
            raise ConfigurationError(
                "streams", f"{cls.__qualname__}.streams must be a list of names, not one name"
            )
        handle = cls.__dict__.get("handle")
        problem = None if handle is None else handler_kind_problem(handle)
        if problem is not None:
            raise ConfigurationError(
                "handle",
                f"{cls.__qualname__}.handle is {problem}: define it as "
                "'async def handle(self, message)' or a plain 'def handle(self, message)'",
            )

    # -- the subclass contract -----------------------------------------------------------

    @abc.abstractmethod
    def handle(self, message: Message[F]) -> Awaitable[None] | None:
        """Process one entry, as ``StreamConsumer.handle()`` does: ``async def`` or a
        plain ``def`` (run in a worker thread); return to have it acknowledged, raise
        `Retry` or `DeadLetter`, or any other exception to retry with backoff up to
        ``max_handler_attempts``. ``message.info`` is empty (entries of a shared group
        come from any producer, not from an assignment)."""

    async def on_startup(self) -> None:
        """Called once by :meth:`run` before the first read; if it raises, ``run()``
        raises :class:`HookFailed` and nothing is read."""

    async def on_shutdown(self) -> None:
        """Called once at the end of :meth:`run`, after the last handler returned."""

    # -- public framework API ------------------------------------------------------------

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
    def read_streams(self) -> tuple[str, ...]:
        """The streams this consumer reads."""
        return self.__runtime.streams

    @final
    @property
    def redis(self) -> Any:
        """The Redis client this consumer was built with, for a handler's own commands."""
        return self.__runtime.client

    @final
    def statistics(self) -> ConsumerStatistics:
        """A frozen snapshot: streams with a live member (``owned_streams``), batches
        being handled, the last Redis reply and reclaim pass, health and readiness, and
        counts of what happened (entries, dead letters, reclaimed and trimmed entries)."""
        return self.__runtime.statistics()

    @final
    async def wait_ready(self) -> None:
        """Wait until :meth:`run` has joined the group on every stream (or tried for
        one session TTL)."""
        await self.__runtime.wait_ready()

    @final
    async def aclose(self) -> None:
        """Stop gracefully and wait until :meth:`run` returned: reads stop, the call in
        flight gets ``shutdown_grace_s``, what was handled is acknowledged, and what
        was read but not handled goes to the other consumers at once."""
        await self.__runtime.aclose()

    @final
    async def __aenter__(self) -> GroupConsumer[F]:
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
            HookFailed: ``on_startup`` or ``on_shutdown`` raised.
        """
        await self.__runtime.run(task_status)


def group_probes(
    consumer: GroupConsumer[Any],
) -> tuple[Callable[[], tuple[bool, str]], Callable[[], tuple[bool, str]]]:
    """``consumer``'s liveness and readiness checks, callable from any thread (the
    worker's HTTP endpoint); each answers (ok, a one-line reason)."""
    runtime = group_runtime_of(consumer)
    return runtime.health, runtime.readiness


def group_runtime_of(consumer: GroupConsumer[Any]) -> GroupRuntime:
    """The private runtime of ``consumer``: for this package's white-box tests only."""
    runtime: GroupRuntime = consumer._GroupConsumer__runtime  # type: ignore[attr-defined]
    return runtime
