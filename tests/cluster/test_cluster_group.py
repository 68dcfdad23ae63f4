"""``GroupConsumer`` on a private 3 + 3 OSS cluster: a primary killed while two
consumers share streams on every primary loses nothing and leaves nothing pending
(docs/shared-groups.md)."""

from __future__ import annotations

import statistics
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import anyio.to_thread
import pytest
from redis import Redis as SyncRedis
from redis.asyncio.cluster import ClusterNode, RedisCluster

from streamjobs import ClusterMode, ConsumerConfig, GroupConsumer, Message, RecoveryConfig
from streamjobs._cluster_waiter import ClusterWaiter
from streamjobs._keys import Keys
from streamjobs.group import group_runtime_of
from streamjobs.testing import LocalCluster
from tests.harness.cluster import ClusterEndpoint, close_cluster_client
from tests.integration._helpers import eventually, true

from .test_cluster_consumer import client_for, names_on_each_primary
from .test_cluster_idle_wait import clients, local

pytestmark = pytest.mark.anyio


@pytest.fixture
async def fresh_client(fresh_cluster: LocalCluster) -> AsyncIterator[RedisCluster]:
    rc = await client_for(fresh_cluster)
    yield rc
    await close_cluster_client(rc)


class Counting(GroupConsumer):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.handled: list[tuple[str, str]] = []

    async def handle(self, message: Message) -> None:
        await anyio.sleep(0.01)  # handling takes a moment, as real work does
        self.handled.append((message.stream, message.id))


async def test_a_primary_killed_under_a_shared_group_loses_nothing(
    fresh_cluster: LocalCluster, fresh_client: RedisCluster, service: str, uid: str
) -> None:
    rc = fresh_client
    streams = names_on_each_primary(rc, f"g:{uid}", per_primary=1)
    ids: set[tuple[str, str]] = set()
    for s in streams:
        for i in range(150):
            ids.add((s, (await rc.xadd(s, {"n": str(i)})).decode()))
    victim = rc.get_node_from_key(streams[0]).port
    # A session TTL above the ~3.5 s failover, so the members ride through it; small
    # batches, so progress needs the promoted replica.
    config = ConsumerConfig(lock_ttl_s=8, read_block_ms=100, read_batch_size=5)
    recovery = RecoveryConfig(min_idle_s=12)
    consumers = [
        Counting(
            rc,
            service=service,
            streams=streams,
            cluster_mode=ClusterMode.OSS,
            config=config,
            recovery=recovery,
            consumer_name=f"c{i}",
        )
        for i in range(2)
    ]

    def handled() -> set[tuple[str, str]]:
        return {x for c in consumers for x in c.handled}

    async with anyio.create_task_group() as tg:
        for c in consumers:
            await tg.start(c.run)
        await eventually(lambda: true(len(handled()) > 60))
        killed = time.monotonic()
        await anyio.to_thread.run_sync(fresh_cluster.kill_node, victim)
        await eventually(lambda: true(handled() >= ids), timeout_s=60)
        print(f"\ngroup crash failover: every entry handled {time.monotonic() - killed:.1f}s after")
        for c in consumers:
            await c.aclose()
    dead_letters = await rc.xlen(Keys(service).dead_letters)
    assert handled() >= ids
    assert dead_letters == 0
    for s in streams:
        assert (await rc.xpending(s, service))["pending"] == 0, s


async def test_idle_group_streams_share_one_subscription_per_primary(
    redis_cluster: ClusterEndpoint, cluster_client: RedisCluster, service: str, uid: str
) -> None:
    """Idle streams of a group consumer wait on the keyspace subscription of their
    primary (as StreamConsumer's do), not in a blocking XREADGROUP each, and a write
    to any of them is handled at once (the safety re-read is minutes away)."""
    cluster = local(redis_cluster)
    rc = cluster_client
    primaries = cluster.primaries()
    streams = [f"gi:{uid}:{i}" for i in range(60)]
    before = {p: len(clients(p)) for p in primaries}
    c = Counting(
        rc,
        service=service,
        streams=streams,
        cluster_mode=ClusterMode.OSS,
        config=ConsumerConfig(read_block_ms=500),
    )
    async with c:
        waiter = group_runtime_of(c).waiter
        assert isinstance(waiter, ClusterWaiter)

        async def all_idle() -> bool:
            return sum(len(node.subscribed) for node in waiter.nodes.values()) == len(streams)

        await eventually(all_idle, timeout_s=30)
        after = {p: len(clients(p)) for p in primaries}
        assert _blocked_reads(primaries) == 0
        assert sum(after.values()) - sum(before.values()) < len(streams), (before, after)
        await _each_write_is_handled(rc, c, streams[::7])
    for stream in streams[::7]:
        assert (await rc.xpending(stream, service))["pending"] == 0, stream


async def test_idle_group_streams_poll_where_the_keyspace_flags_are_refused(
    fresh_cluster: LocalCluster, service: str, uid: str
) -> None:
    """A consumer whose ACL user may not run CONFIG (a managed cluster): it cannot set
    the keyspace flags, so no event will come, and idle streams read again every
    read_block_ms, with no blocking read (and no connection) of their own."""
    for _, port in fresh_cluster.startup_nodes:
        with SyncRedis(port=port) as node:
            node.execute_command(
                "ACL", "SETUSER", "noconfig", "on", ">pw", "~*", "&*", "+@all", "-config"
            )
    rc = RedisCluster(
        startup_nodes=[ClusterNode(h, p) for h, p in fresh_cluster.startup_nodes],
        username="noconfig",
        password="pw",
    )
    await rc.initialize()
    streams = [f"gp:{uid}:{i}" for i in range(30)]
    c = Counting(
        rc,
        service=service,
        streams=streams,
        cluster_mode=ClusterMode.OSS,
        config=ConsumerConfig(read_block_ms=200),
    )
    try:
        async with c:
            waiter = group_runtime_of(c).waiter
            assert isinstance(waiter, ClusterWaiter)
            await eventually(lambda: true(waiter.flags_refused), timeout_s=10)
            await _each_write_is_handled(rc, c, streams[::5])
            primaries = fresh_cluster.primaries()
            # Counted over a window of several polls, not at one moment: a single
            # count of every connection was at the mercy of a loaded machine, where
            # the streams' polls bunch up and the client's pool grows to carry them at
            # once (its connections stay open, shared, and idle after).
            blocked, held, outside = [], [], []
            for _ in range(WINDOW_SAMPLES):
                blocked.append(_blocked_reads(primaries))
                held.append(_held_connections(rc))
                outside.append(sum(len(clients(p)) for p in primaries) - _pool_size(rc))
                await anyio.sleep(0.1)  # the sampling interval: the window is the point
            # No stream blocks in a read of its own, at any moment ...
            assert blocked == [0] * WINDOW_SAMPLES, blocked
            # ... nor holds a connection of its own: a connection per idle stream would
            # be held at every sample, polls hold one only for their round trip.
            assert statistics.median(held) < len(streams), held
            # ... nor has a connection of its own outside the client's pool.
            assert max(outside) < len(streams), outside
    finally:
        await close_cluster_client(rc)


WINDOW_SAMPLES = 20
"""Samples of the connections, 0.1 s apart: about ten polls of every idle stream."""


def _blocked_reads(primaries: list[int]) -> int:
    """Connections of the primaries blocked in an XREADGROUP now (a connection whose
    last command was a read that returned at once is not blocked)."""
    return sum(
        1
        for p in primaries
        for client in clients(p)
        if client.get("cmd") == "xreadgroup" and "b" in client.get("flags", "")
    )


def _held_connections(rc: RedisCluster) -> int:
    """Connections of ``rc``'s pools taken by a caller now (not handed back)."""
    return sum(len(node._connections) - len(node._free) for node in rc.get_nodes())


def _pool_size(rc: RedisCluster) -> int:
    """Connections ``rc``'s pools have opened, in use or not."""
    return sum(len(node._connections) for node in rc.get_nodes())


async def _each_write_is_handled(rc: RedisCluster, c: Counting, streams: list[str]) -> None:
    """An entry appended to each idle stream in turn is handled within moments."""
    for i, stream in enumerate(streams):
        written = (stream, (await rc.xadd(stream, {"n": str(i)})).decode())

        async def handled(written: tuple[str, str] = written) -> bool:
            return written in c.handled

        with anyio.fail_after(5):
            await eventually(handled, timeout_s=5)
