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

from collections.abc import Sequence
from typing import Any, ClassVar, final

from ._base_consumer import BaseConsumer, service_gateway, settings
from ._checks import PoolNeed, check_pool, consumer_name_of
from ._group import GroupRuntime
from ._keys import Keys
from ._kind_runtime import Parts
from ._waiter import shard_count
from .config import (
    ClusterMode,
    ConsumerConfig,
    GroupRetention,
    RecoveryConfig,
)
from .exceptions import ConfigurationError
from .message import F
from .metrics import MetricsRecorder, NullRecorder

_START_IDS = ("0", "$")


def _pool_need(config: ConsumerConfig, streams: int, cluster: bool) -> PoolNeed:
    """A ``GroupConsumer``'s connections: its command slots, the command channel's and
    a spare, and on a standalone server one shared blocking read per 1,250 idle
    streams. On a cluster idle streams wait on keyspace subscriptions, whose
    connections are not the pool's: a cluster client's default pool (100 per node)
    serves any number of streams."""
    return PoolNeed(
        slots=config.redis_concurrency,
        fixed=2,
        shards=0 if cluster else shard_count(streams),
        streams=streams,
        streams_field="streams",
    )


class GroupConsumer(BaseConsumer[F]):
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
        retention = GroupRetention() if retention is None else retention
        if not isinstance(retention, GroupRetention):
            raise ConfigurationError("retention", "must be a GroupRetention")
        config, recovery = settings(redis, config, recovery, cluster_mode)
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
        gateway = service_gateway(redis, keys, recovery, type(self).fields_type)
        check_pool(redis, _pool_need(config, len(chosen), cluster_mode is not ClusterMode.NONE))
        name = consumer_name_of(consumer_name)
        runtime = GroupRuntime(
            Parts(self, gateway, redis, name, config, recovery, metrics or NullRecorder()),
            streams=chosen,
            start_id=start_id,
            cluster=cluster_mode is not ClusterMode.NONE,
            retention=retention,
        )
        super().__init__(runtime)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if isinstance(cls.__dict__.get("streams"), str):
            raise ConfigurationError(
                "streams", f"{cls.__qualname__}.streams must be a list of names, not one name"
            )

    # -- public framework API ------------------------------------------------------------

    @final
    @property
    def read_streams(self) -> tuple[str, ...]:
        """The streams this consumer reads."""
        return group_runtime_of(self).streams


def group_runtime_of(consumer: GroupConsumer[Any]) -> GroupRuntime:
    """The private runtime of ``consumer``: for this package's white-box tests only."""
    runtime: GroupRuntime = consumer._BaseConsumer__runtime  # type: ignore[attr-defined]
    return runtime
