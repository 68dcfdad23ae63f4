from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from streamjobs import (
    ClusterMode,
    ConfigurationError,
    ConsumerConfig,
    GroupConsumer,
    Message,
    RecoveryConfig,
    StreamConsumer,
)

CONSUMER_BAD: list[tuple[str, Any]] = [
    ("lock_ttl_s", 0),
    ("lock_ttl_s", -1),
    ("lock_ttl_s", float("nan")),
    ("lock_ttl_s", "10"),
    ("heartbeat_interval_s", 0),
    ("heartbeat_interval_s", 5.0),  # not < lock_ttl_s / 2 with the default 10 s TTL
    ("lease_margin_s", -0.1),
    ("lease_margin_s", 9.0),
    ("max_concurrent_streams", 0),
    ("max_concurrent_streams", 1.5),
    ("max_concurrent_streams", True),
    ("read_batch_size", 0),
    ("read_batch_size", 100_000),
    ("read_block_ms", 0),
    ("read_batch_bytes", 0),
    ("read_batch_bytes", 1.5),
    ("stream_idle_timeout_s", 0),
    ("stream_idle_timeout_s", float("nan")),
    ("max_handler_attempts", 0),
    ("handler_backoff_s", -1),
    ("handler_backoff_max_s", float("inf")),
    ("shutdown_grace_s", -1),
    ("finished_stream_ttl_s", -5),
    ("key_prefix", ""),
    ("key_prefix", "a{b"),
]

RECOVERY_BAD: list[tuple[str, Any]] = [
    ("interval_s", 0),
    ("jitter_fraction", -0.1),
    ("jitter_fraction", 1.5),
    ("min_idle_s", 0),
    ("batch_size", 0),
    ("max_retries", -1),
    ("dlq_stream", ""),
    ("dlq_maxlen", -1),
    ("lease_check_interval_s", 0),
    ("notification_delay_max_s", -1),
    ("configure_keyspace_events", "yes"),
]


@pytest.mark.parametrize(("field", "value"), CONSUMER_BAD)
def test_consumer_config_rejects_bad_value_naming_the_field(field: str, value: Any) -> None:
    with pytest.raises(ConfigurationError) as info:
        ConsumerConfig(**{field: value})
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}: ")


@pytest.mark.parametrize(("field", "value"), RECOVERY_BAD)
def test_recovery_config_rejects_bad_value_naming_the_field(field: str, value: Any) -> None:
    with pytest.raises(ConfigurationError) as info:
        RecoveryConfig(**{field: value})
    assert info.value.field == field


def test_defaults_are_valid_and_derived_values_follow_the_ttl() -> None:
    cfg = ConsumerConfig(lock_ttl_s=9)
    assert cfg.heartbeat_s == pytest.approx(3)
    assert cfg.margin_s == pytest.approx(0.9)
    assert cfg.lock_ttl_ms == 9000
    RecoveryConfig().check_against(ConsumerConfig())


def test_min_idle_must_exceed_lock_ttl() -> None:
    with pytest.raises(ConfigurationError) as info:
        RecoveryConfig(min_idle_s=10).check_against(ConsumerConfig(lock_ttl_s=10))
    assert info.value.field == "min_idle_s"


def test_configs_are_frozen_and_keyword_only() -> None:
    cfg = ConsumerConfig()
    with pytest.raises(AttributeError):
        cfg.lock_ttl_s = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        ConsumerConfig(10)  # type: ignore[call-arg]


class _Consumer(StreamConsumer):
    async def handle(self, message: Message) -> None:
        pass


def _client_for(mode: ClusterMode) -> Any:
    """A client that goes with ``mode``; constructing it does no I/O."""
    return RedisCluster(host="127.0.0.1", port=1) if mode is ClusterMode.OSS else Redis()


@pytest.mark.parametrize("mode", list(ClusterMode))
def test_a_dlq_stream_outside_the_services_slot_is_rejected_in_every_cluster_mode(
    mode: ClusterMode,
) -> None:
    """A standalone deployment may become a cluster later: the rule holds everywhere."""
    client = _client_for(mode)
    with pytest.raises(ConfigurationError) as info:
        _Consumer(
            client, service="svc", cluster_mode=mode, recovery=RecoveryConfig(dlq_stream="dlq")
        )
    assert info.value.field == "dlq_stream"
    assert "{svc}" in info.value.rule
    ok = _Consumer(
        client,
        service="svc",
        cluster_mode=mode,
        recovery=RecoveryConfig(dlq_stream="app:{svc}:dead"),
    )
    assert ok.service == "svc"
    with pytest.raises(ConfigurationError, match="dlq_stream"):
        _Consumer(
            client,
            service="svc",
            cluster_mode=mode,
            recovery=RecoveryConfig(dlq_stream="streamjobs:{svc}:lbs"),
        )


@pytest.mark.parametrize("cluster", [False, True])
def test_a_block_longer_than_the_clients_socket_timeout_is_refused(cluster: bool) -> None:
    """With a 5 s socket timeout, a 6 s blocking read would time out on every idle read."""

    def client(timeout: float | None) -> Any:
        if cluster:
            return RedisCluster(host="127.0.0.1", port=1, socket_timeout=timeout)
        return Redis(socket_timeout=timeout)

    mode = ClusterMode.OSS if cluster else ClusterMode.NONE
    with pytest.raises(ConfigurationError) as info:
        _Consumer(
            client(5), service="svc", cluster_mode=mode, config=ConsumerConfig(read_block_ms=6000)
        )
    assert info.value.field == "read_block_ms"
    assert "socket_timeout (5s)" in info.value.rule
    assert "<= 4500" in info.value.rule
    ok = ConsumerConfig(read_block_ms=4500)
    assert _Consumer(client(5), service="svc", cluster_mode=mode, config=ok).service == "svc"
    # No socket timeout: any block is fine.
    long = ConsumerConfig(read_block_ms=60_000)
    assert _Consumer(client(None), service="svc", cluster_mode=mode, config=long).service == "svc"


def test_more_streams_than_a_cluster_pool_can_serve_are_refused() -> None:
    """On a cluster each waiting stream blocks a connection of its own: 95 of them plus
    the command slots and blocking reads would exhaust redis-py's 100-connection pool."""

    def client(max_connections: int) -> Any:
        return RedisCluster(host="127.0.0.1", port=1, max_connections=max_connections)

    many = ConsumerConfig(max_concurrent_streams=95)
    with pytest.raises(ConfigurationError) as info:
        _Consumer(client(100), service="svc", cluster_mode=ClusterMode.OSS, config=many)
    assert info.value.field == "max_concurrent_streams"
    assert "max_connections>=115" in info.value.rule
    assert "lower max_concurrent_streams to 80" in info.value.rule
    ok = _Consumer(client(115), service="svc", cluster_mode=ClusterMode.OSS, config=many)
    assert ok.service == "svc"


def test_a_standalone_pool_holds_a_connection_per_shard_of_the_idle_wait() -> None:
    """10,000 streams wait on 8 shared blocking reads (one per 1,250): a pool of 20
    fits the command slots but not the shards, and the error names the streams."""
    thousands = ConsumerConfig(max_concurrent_streams=10_000)
    with pytest.raises(ConfigurationError) as info:
        _Consumer(Redis(max_connections=20), service="svc", config=thousands)
    assert info.value.field == "max_concurrent_streams"
    assert "on 8 shared blocking reads" in info.value.rule
    assert "max_connections>=27" in info.value.rule
    assert "lower max_concurrent_streams to 1250" in info.value.rule
    assert _Consumer(Redis(max_connections=27), service="svc", config=thousands).service == "svc"
    few = ConsumerConfig(max_concurrent_streams=1_250)
    assert _Consumer(Redis(max_connections=20), service="svc", config=few).service == "svc"


def test_a_standalone_pool_needs_the_command_slots_not_a_connection_per_stream() -> None:
    """Idle streams share one blocking read on a standalone server: 10,000 streams fit
    the default pool; the command slots (redis_concurrency) are what must fit."""
    thousands = ConsumerConfig(max_concurrent_streams=10_000)
    assert _Consumer(Redis(), service="svc", config=thousands).service == "svc"
    with pytest.raises(ConfigurationError) as info:
        _Consumer(Redis(), service="svc", config=ConsumerConfig(redis_concurrency=97))
    assert info.value.field == "redis_concurrency"
    assert "max_connections>=101" in info.value.rule


@pytest.mark.parametrize("cluster", [False, True])
def test_the_socket_timeout_a_url_client_gets_by_default_is_checked(cluster: bool) -> None:
    """``from_url()`` leaves redis-py's default socket timeout (5 s in redis-py 8) out of
    the connection settings: the check must still see the one connections will use."""
    url = "redis://127.0.0.1:1"
    target = RedisCluster.from_url(url) if cluster else Redis.from_url(url)
    pool = getattr(target, "connection_pool", None)
    settings = getattr(pool, "connection_kwargs", None) or target.connection_kwargs
    used = settings.get("socket_timeout")
    if used is None:  # what a connection built from these settings gets
        used = pool.connection_class(**settings).socket_timeout
    mode = ClusterMode.OSS if cluster else ClusterMode.NONE
    if used is None:
        pytest.skip("this redis-py gives connections no socket timeout by default")
    too_long = ConsumerConfig(read_block_ms=int(used * 1000) + 1000)
    with pytest.raises(ConfigurationError) as info:
        _Consumer(target, service="svc", cluster_mode=mode, config=too_long)
    assert info.value.field == "read_block_ms"
    assert f"socket_timeout ({used:g}s)" in info.value.rule


class _Group(GroupConsumer):
    async def handle(self, message: Message) -> None:
        pass


def test_a_group_on_a_cluster_reads_any_number_of_streams_with_the_default_pool() -> None:
    """Idle group streams wait on keyspace subscriptions (connections of their own),
    so 5,000 streams fit redis-py's default 100-connection cluster pool; what must fit
    is the command slots and the channel's connection."""
    cluster = RedisCluster(host="127.0.0.1", port=1)
    streams = [f"s{i}" for i in range(5000)]
    group = _Group(cluster, service="svc", streams=streams, cluster_mode=ClusterMode.OSS)
    assert len(group.read_streams) == 5000
    small = RedisCluster(host="127.0.0.1", port=1, max_connections=10)
    with pytest.raises(ConfigurationError) as info:
        _Group(small, service="svc", streams=streams, cluster_mode=ClusterMode.OSS)
    assert info.value.field == "redis_concurrency"
    assert "max_connections>=18" in info.value.rule


def test_a_group_on_one_server_needs_a_connection_per_shard_of_the_idle_wait() -> None:
    streams = [f"s{i}" for i in range(10_000)]  # 8 shared blocking reads
    assert _Group(Redis(max_connections=26), service="svc", streams=streams).service == "svc"
    with pytest.raises(ConfigurationError) as info:
        _Group(Redis(max_connections=20), service="svc", streams=streams)
    assert info.value.field == "streams"
    assert "max_connections>=26" in info.value.rule
