"""StreamConsumer: subclass it, implement ``handle()``, run it.

What it adds to the contract both kinds share (``_base_consumer``): the hooks of an
owned stream, and the framework methods that act on owned streams (``finish``,
``claim``, ``reset_topology``). Its runtime is ``_runtime.Runtime``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, final

from ._base_consumer import BaseConsumer, service_gateway, settings
from ._checks import PoolNeed, check_pool, consumer_name_of
from ._keys import Keys
from ._kind_runtime import Parts
from ._runtime import Runtime
from ._waiter import shard_count
from .config import ClusterMode, ConsumerConfig, RecoveryConfig
from .message import F
from .metrics import MetricsRecorder, NullRecorder, RequeueOutcome

_BLOCKING_CONNECTIONS = 4
"""Connections held outside the command slots: intake, the shared idle wait (its first
shard), the keyspace subscription, and the command channel's (one per node)."""


def _pool_need(config: ConsumerConfig, cluster_mode: ClusterMode) -> PoolNeed:
    """A ``StreamConsumer``'s connections: its command slots and blocking connections;
    on a standalone server one per shard of the shared idle wait (one per 1,250
    ``max_concurrent_streams``, at most 16, the first counted above); without it (a
    cluster, or a proxy) a connection per owned stream waiting for entries."""
    streams = config.max_concurrent_streams
    if cluster_mode is ClusterMode.NONE:
        return PoolNeed(
            slots=config.redis_concurrency,
            fixed=_BLOCKING_CONNECTIONS - 1,
            shards=shard_count(streams),
            streams=streams,
        )
    return PoolNeed(
        slots=config.redis_concurrency,
        fixed=_BLOCKING_CONNECTIONS,
        per_stream=streams,
        streams=streams,
    )


class StreamConsumer(BaseConsumer[F]):
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
        config, recovery = settings(redis, config, recovery, cluster_mode)
        check_pool(redis, _pool_need(config, cluster_mode))
        keys = Keys(service, config.key_prefix)
        gateway = service_gateway(redis, keys, recovery, type(self).fields_type)
        name = consumer_name_of(consumer_name)
        metrics = metrics or NullRecorder()
        parts = Parts(self, gateway, redis, name, config, recovery, metrics)
        runtime = Runtime(parts, cluster_mode=cluster_mode)
        super().__init__(runtime)

    # -- the subclass contract -------------------------------------------------------

    # -- the hooks of an owned stream -----------------------------------------------

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
    def owned_streams(self) -> frozenset[str]:
        """Names of the streams this consumer currently holds the lock of."""
        return runtime_of(self).owned_streams()

    @final
    def finish(self, stream: str) -> None:
        """Finish ``stream`` after the current entry, as if its end marker had been read."""
        runtime_of(self).finish(stream)

    @final
    async def claim(self, assignment_id: str) -> RequeueOutcome:
        """Recover one pending assignment now (the primitive the scanner uses).

        The lock of its stream must be gone (``OWNER_ALIVE`` otherwise). The result is
        that the assignment is re-queued for whichever consumer reads it next, or
        dead-lettered; this consumer does not take it directly.
        """
        return await runtime_of(self).claim(assignment_id)

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
        await runtime_of(self).reset_topology()


def runtime_of(consumer: StreamConsumer[Any]) -> Runtime:
    """The private runtime of ``consumer``: for this package's white-box tests only."""
    runtime: Runtime = consumer._BaseConsumer__runtime  # type: ignore[attr-defined]
    return runtime
