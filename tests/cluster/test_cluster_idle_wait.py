"""Idle waiting on an OSS cluster (docs/design.md#idle-waiting-on-a-cluster): idle
streams wait on one keyspace subscription per primary, not on a blocking read each,
and a write to any of them wakes it within moments, also one made while its
subscription was on its way."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
from redis import Redis as SyncRedis
from redis.asyncio.cluster import RedisCluster

from streamjobs import ClusterMode, ConsumerConfig, NullRecorder, Producer, RecoveryConfig
from streamjobs._cluster_waiter import ClusterWaiter
from streamjobs._keys import Keys
from streamjobs._redis import Channel, Gateway
from streamjobs.consumer import runtime_of
from streamjobs.testing import LocalCluster
from tests.harness.cluster import ClusterEndpoint
from tests.integration._helpers import Recorder, eventually

pytestmark = pytest.mark.anyio

STREAMS = 60


def local(cluster: ClusterEndpoint) -> LocalCluster:
    if not isinstance(cluster, LocalCluster):
        pytest.skip("needs a cluster this session started")
    return cluster


def clients(port: int) -> list[dict[str, Any]]:
    with SyncRedis(port=port) as r:
        return list(r.client_list())


def blocked_reads(port: int) -> int:
    return sum(1 for c in clients(port) if c.get("cmd") == "xread")


async def test_idle_streams_share_one_subscription_per_primary_and_wake_on_writes(
    redis_cluster: ClusterEndpoint, cluster_client: RedisCluster, service: str, uid: str
) -> None:
    cluster = local(redis_cluster)
    rc = cluster_client
    primaries = cluster.primaries()
    producer = Producer(rc, service=service)
    names = [f"idle:{uid}:{i}" for i in range(STREAMS)]
    for name in names:
        await producer.add_stream(name)
    before = {p: len(clients(p)) for p in primaries}
    c = Recorder(
        rc,
        service=service,
        cluster_mode=ClusterMode.OSS,
        config=ConsumerConfig(max_concurrent_streams=STREAMS, read_block_ms=500),
        recovery=RecoveryConfig(min_idle_s=60),
    )
    async with c:
        waiter = runtime_of(c).waiter
        assert isinstance(waiter, ClusterWaiter)

        async def all_idle() -> bool:
            subscribed = sum(len(node.subscribed) for node in waiter.nodes.values())
            return len(c.started) == STREAMS and subscribed == STREAMS

        await eventually(all_idle, timeout_s=30)
        after = {p: len(clients(p)) for p in primaries}
        # One subscription per primary, not a blocking read per idle stream.
        assert all(blocked_reads(p) == 0 for p in primaries)
        assert all(after[p] - before[p] <= 20 for p in primaries), (before, after)
        assert sum(after.values()) - sum(before.values()) < STREAMS

        # A write to any idle stream wakes it at once (the safety re-read is minutes).
        for i, name in enumerate(names[::7]):
            await producer.append(name, {"n": str(i)})

            async def handled(name: str = name) -> bool:
                return any(stream == name for _, stream, _, _ in c.handled)

            with anyio.fail_after(5):
                await eventually(handled, timeout_s=5)


@pytest.fixture
async def waiter(cluster_client: RedisCluster, service: str) -> AsyncIterator[ClusterWaiter]:
    gateway = Gateway(cluster_client, Keys(service))
    gateway.scripts.channel = Channel(cluster_client)
    w = ClusterWaiter(cluster_client, gateway, metrics=NullRecorder(), service=service)
    async with anyio.create_task_group() as tg:
        await tg.start(w.run)
        yield w
        tg.cancel_scope.cancel()


async def _woken_within(waiter: ClusterWaiter, stream: str, after_id: str, s: float) -> bool:
    started = time.monotonic()
    await waiter.wait(stream, after_id, 10.0)
    return time.monotonic() - started < s


async def test_an_entry_appended_before_the_subscription_wakes_the_stream(
    waiter: ClusterWaiter, cluster_client: RedisCluster, uid: str
) -> None:
    """What was appended after the stream's last read but before its subscription was
    confirmed published no event anyone heard: the check after the confirmation
    finds it."""
    stream = f"gap:{uid}"
    last = await cluster_client.xadd(stream, {"n": "0"})
    await cluster_client.xadd(stream, {"n": "1"})  # the read that found nothing missed it
    assert await _woken_within(waiter, stream, last.decode(), 2.0)


async def test_a_stream_deleted_before_the_subscription_wakes(
    waiter: ClusterWaiter, cluster_client: RedisCluster, uid: str
) -> None:
    stream = f"gone:{uid}"
    last = await cluster_client.xadd(stream, {"n": "0"})
    await cluster_client.delete(stream)
    assert await _woken_within(waiter, stream, last.decode(), 2.0)


async def test_a_write_after_the_subscription_wakes_and_nothing_else_does(
    waiter: ClusterWaiter, cluster_client: RedisCluster, uid: str, service: str
) -> None:
    stream = f"write:{uid}"
    last = (await cluster_client.xadd(stream, {"n": "0"})).decode()
    await cluster_client.xgroup_create(stream, service, id="$")
    woken = anyio.Event()

    async def wait() -> None:
        await waiter.wait(stream, last, 10.0)
        woken.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait)

        async def subscribed() -> bool:
            return any(stream in node.subscribed for node in waiter.nodes.values())

        await eventually(subscribed, timeout_s=5)
        # The group's own bookkeeping (a read creating a consumer) wakes nobody.
        await cluster_client.xreadgroup(service, "someone", {stream: ">"}, count=1)
        with anyio.move_on_after(0.5):
            await woken.wait()
        assert not woken.is_set()
        await cluster_client.xadd(stream, {"n": "1"})
        with anyio.fail_after(2):
            await woken.wait()

    async def unsubscribed() -> bool:
        return not any(stream in node.subscribed for node in waiter.nodes.values())

    await eventually(unsubscribed, timeout_s=5)
