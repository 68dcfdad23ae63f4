"""Recovery paths in-process against real Redis: claim races, scanner cursor, no notifications."""

from __future__ import annotations

import time
from typing import Any

import anyio
import pytest
from redis.asyncio import Redis as AsyncRedis

from streamjobs import (
    ClusterMode,
    ConsumerConfig,
    DeadLetterReason,
    NullRecorder,
    Producer,
    RecoveryConfig,
    RequeueOutcome,
)
from streamjobs._keys import Keys
from streamjobs._redis import Gateway
from streamjobs._redis._streams import StreamCommands
from tests.harness.plugin import ConsumerFactory, RedisServerFactory

from ._helpers import Recorder, eventually

pytestmark = pytest.mark.anyio


async def strand(redis: AsyncRedis, service: str, streams: list[str], ghost: str) -> list[str]:
    """Queue assignments and have a consumer that then 'dies' read them (no lock)."""
    producer = Producer(redis, service=service)
    keys = Keys(service)
    if not await redis.exists(keys.assignments):
        await redis.xgroup_create(keys.assignments, service, id="0", mkstream=True)
    for s in streams:
        await producer.add_stream(s)
        await producer.append(s, {"n": "0"})
        await producer.close_stream(s)
    reply: Any = await redis.xreadgroup(service, ghost, {keys.assignments: ">"}, count=len(streams))
    return [i.decode() for i, _ in reply[0][1]]


async def test_concurrent_claims_requeue_exactly_once(
    redis: AsyncRedis, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    [aid] = await strand(redis, service, [f"d:{uid}"], "ghost")
    consumers = [consumer_factory(Recorder) for _ in range(8)]
    outcomes: list[RequeueOutcome] = []

    async def claim(c: Recorder) -> None:
        outcomes.append(await c.claim(aid))

    async with anyio.create_task_group() as tg:
        for c in consumers:
            tg.start_soon(claim, c)
    assert outcomes.count(RequeueOutcome.REQUEUED) == 1
    assert set(outcomes) <= {RequeueOutcome.REQUEUED, RequeueOutcome.LOST_RACE}
    entries = list(await redis.xrange(Keys(service).assignments) or [])
    assert len(entries) == 1
    [(new_id, fields)] = entries
    assert new_id.decode() != aid
    assert fields[b"_retry_count"] == b"1"
    assert fields[b"stream"] == f"d:{uid}".encode()


async def test_claim_skips_a_live_owner(
    redis: AsyncRedis, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    [aid] = await strand(redis, service, [f"d:{uid}"], "ghost")
    await redis.set(Keys(service).lock(f"d:{uid}"), "alive:1", px=10_000)
    c = consumer_factory(Recorder)
    assert await c.claim(aid) is RequeueOutcome.OWNER_ALIVE
    assert (await redis.xpending(Keys(service).assignments, service))["pending"] == 1


async def test_scanner_cursor_reaches_a_dead_entry_behind_live_ones(
    redis: AsyncRedis, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    live = [f"live:{uid}:{i}" for i in range(7)]
    dead = f"dead:{uid}"
    keys = Keys(service)
    await strand(redis, service, live, "ghost-live")
    for s in live:  # long-running live owners, no lease records: the scan must look
        await redis.set(keys.lock(s), "ghost-live:1", px=60_000)
    await strand(redis, service, [dead], "ghost-dead")
    c = consumer_factory(
        Recorder,
        config=ConsumerConfig(lock_ttl_s=0.5, read_block_ms=50),
        recovery=RecoveryConfig(min_idle_s=0.6, interval_s=0.3, batch_size=5),
    )
    t0 = time.monotonic()
    async with c:

        async def recovered() -> bool:
            return dead in c.ended

        await eventually(recovered, timeout_s=10)
    print(f"\nscanner-only recovery behind {len(live)} live entries: {time.monotonic() - t0:.2f}s")
    pending = await redis.xpending_range(keys.assignments, service, "-", "+", 100)
    assert len(pending) == len(live), "live entries must stay with their owners"
    assert {p["consumer"] for p in pending} == {b"ghost-live"}


async def test_recovery_without_keyspace_notifications(
    redis_server_factory: RedisServerFactory, service: str, uid: str
) -> None:
    server = redis_server_factory()
    client = AsyncRedis.from_url(server.url)
    try:
        await client.config_set("notify-keyspace-events", "")
        recovery = RecoveryConfig(
            min_idle_s=1.5, interval_s=1, jitter_fraction=0.1, configure_keyspace_events=False
        )
        cfg = ConsumerConfig(lock_ttl_s=1, read_block_ms=50)
        stream = f"d:{uid}"
        keys = Keys(service)
        # A dead owner: lock taken and lease recorded, then nothing more (kill -9).
        [aid] = await strand(client, service, [stream], "dead-owner")
        await client.set(keys.lock(stream), "dead-owner:1", px=1000)
        now_s, now_us = await client.time()
        await client.zadd(keys.leases, {aid: now_s * 1000 + now_us // 1000 + 1000})
        t0 = time.monotonic()
        c = Recorder(client, service=service, config=cfg, recovery=recovery)
        async with c:

            async def recovered() -> bool:
                return stream in c.ended

            bound = recovery.min_idle_s + recovery.interval_s * 1.1 + 2.0
            await eventually(recovered, timeout_s=bound)
        elapsed = time.monotonic() - t0
        print(f"\nrecovery with notifications off: {elapsed:.2f}s (bound {bound:.2f}s)")
        assert elapsed < bound
        flags = await client.config_get("notify-keyspace-events")
        assert flags == {"notify-keyspace-events": ""}, "hands-off mode ran CONFIG SET"
    finally:
        await client.aclose()


async def test_keyspace_flags_are_merged_not_overwritten(
    redis_server_factory: RedisServerFactory, service: str
) -> None:
    server = redis_server_factory()
    client = AsyncRedis.from_url(server.url)
    try:
        await client.config_set("notify-keyspace-events", "Elg")
        c = Recorder(client, service=service)
        async with c:
            pass
        flags = (await client.config_get("notify-keyspace-events"))["notify-keyspace-events"]
        assert set(flags) >= set("ElgKx")
    finally:
        await client.aclose()


class Counting(NullRecorder):
    def __init__(self) -> None:
        self.trimmed = 0
        self.dead: list[DeadLetterReason] = []
        self.requeues: list[RequeueOutcome] = []

    def dlq_trimmed(self, service: str, count: int) -> None:
        self.trimmed += count

    def dead_lettered(self, service: str, reason: DeadLetterReason) -> None:
        self.dead.append(reason)

    def requeue(self, service: str, outcome: RequeueOutcome) -> None:
        self.requeues.append(outcome)


async def test_dlq_is_trimmed_and_trimming_is_counted(
    redis: AsyncRedis, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    keys = Keys(service)
    pipe = redis.pipeline(transaction=False)
    for i in range(300):
        pipe.xadd(keys.dead_letters, {"old": str(i)})
    await pipe.execute()
    metrics = Counting()
    c = consumer_factory(Recorder, recovery=RecoveryConfig(dlq_maxlen=10), metrics=metrics)
    await redis.xadd(keys.assignments, {"info": "{}"})  # no stream: unparseable
    async with c:

        async def dead() -> bool:
            return bool(metrics.dead)

        await eventually(dead)
    remaining = await redis.xlen(keys.dead_letters)
    assert metrics.dead == [DeadLetterReason.UNPARSEABLE]
    assert metrics.trimmed > 0
    assert remaining == 301 - metrics.trimmed
    assert remaining < 301


async def test_scripts_are_reloaded_after_script_flush(
    redis: AsyncRedis, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    """A promoted replica has an empty script cache; NOSCRIPT must be handled."""
    stream = f"d:{uid}"
    producer = Producer(redis, service=service)
    c = consumer_factory(Recorder, config=ConsumerConfig(lock_ttl_s=2, read_block_ms=50))
    async with c:
        await producer.add_stream(stream)
        await producer.append(stream, {"n": "0"})

        async def first() -> bool:
            return len(c.handled) == 1

        await eventually(first)
        await redis.script_flush()
        await producer.append(stream, {"n": "1"})
        await producer.close_stream(stream)

        async def ended() -> bool:
            return stream in c.ended

        await eventually(ended)
    assert [n for _, _, _, n in c.handled] == ["0", "1"]


async def test_proxy_mode_subscribes_nothing_and_recovers_by_scanning(
    redis_server_factory: RedisServerFactory, service: str, uid: str
) -> None:
    server = redis_server_factory()
    client = AsyncRedis.from_url(server.url)
    try:
        stream = f"d:{uid}"
        keys = Keys(service)
        [aid] = await strand(client, service, [stream], "dead-owner")
        now_s, now_us = await client.time()
        await client.zadd(keys.leases, {aid: now_s * 1000 + now_us // 1000})
        c = Recorder(client, service=service, cluster_mode=ClusterMode.PROXY)
        async with c:
            clients = await client.client_list()
            assert not [x for x in clients if int(x.get("psub", 0)) > 0]

            async def recovered() -> bool:
                return stream in c.ended

            await eventually(recovered, timeout_s=10)
        assert await client.config_get("notify-keyspace-events") == {"notify-keyspace-events": ""}
    finally:
        await client.aclose()


async def test_no_lease_outlives_its_assignment(
    redis: AsyncRedis, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    """A heartbeat racing a finish must not re-create the finished stream's lease, nor
    may an acquisition that stalled past its assignment's finish; and recovery of an
    entry that no longer exists forgets any lease left under its id."""
    keys = Keys(service)
    c = consumer_factory(Recorder)
    gw = Gateway(redis, Keys(service))
    await gw.streams.record_leases(["1-1"], 5000, new=False)  # heartbeat after finish.lua's ZREM
    assert await redis.zcard(keys.leases) == 0
    await gw.streams.record_leases(["1-2"], 5000, new=True)  # an acquisition after its finish
    assert await redis.zcard(keys.leases) == 0
    [aid] = await strand(redis, service, [f"d:{uid}"], "ghost")
    await gw.streams.record_leases([aid], 5000, new=True)
    await gw.streams.record_leases([aid], 9000, new=False)
    assert await redis.zcard(keys.leases) == 1
    await redis.zadd(keys.leases, {aid: 1})
    await redis.xdel(keys.assignments, aid)  # finished elsewhere; PEL and lease left
    assert await c.claim(aid) is RequeueOutcome.LOST_RACE
    assert await redis.zscore(keys.leases, aid) is None
    assert (await redis.xpending(keys.assignments, service))["pending"] == 0


async def test_taking_leases_says_which_assignments_are_still_ours(
    redis: AsyncRedis, service: str, uid: str
) -> None:
    """One lease.lua call for an intake read's assignments: a lease for each one still
    pending with the consumer, and the answer; none for one re-queued to (or read by)
    another consumer meanwhile, nor for one that is gone."""
    keys = Keys(service)
    gw = Gateway(redis, keys)
    [mine] = await strand(redis, service, [f"d:{uid}:0"], "me")
    [theirs] = await strand(redis, service, [f"d:{uid}:1"], "other")
    assert await gw.streams.take_leases([mine, theirs, "1-1"], "me", 5000) == [True, False, False]
    leases: list[tuple[bytes, float]] = list(
        await redis.zrange(keys.leases, 0, -1, withscores=True)
    )
    assert [m for m, _ in leases] == [mine.encode()]
    now_ms = await gw.assignments.server_time_ms()
    assert now_ms < leases[0][1] <= now_ms + 5000
    assert await gw.streams.take_leases([], "me", 5000) == []


class _CountingLeases(StreamCommands):
    batches: list[int] = []

    async def take_leases(self, ids: Any, consumer: str, ttl_ms: int) -> list[bool]:
        type(self).batches.append(len(ids))
        return await super().take_leases(ids, consumer, ttl_ms)


async def test_the_streams_of_one_intake_read_share_one_lease_call(
    redis: AsyncRedis, service: str, uid: str, consumer_factory: ConsumerFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    import streamjobs._base_consumer

    monkeypatch.setattr(_CountingLeases, "batches", [])

    def gateway(*args: Any, **kwargs: Any) -> Gateway:
        made = Gateway(*args, **kwargs)
        made.streams = _CountingLeases(made)
        return made

    monkeypatch.setattr(streamjobs._base_consumer, "Gateway", gateway)
    streams = [f"d:{uid}:{i}" for i in range(30)]
    producer = Producer(redis, service=service)
    for s in streams:
        await producer.add_stream(s)
        await producer.append(s, {"n": "0"})
        await producer.close_stream(s)
    c = consumer_factory(Recorder, config=ConsumerConfig(max_concurrent_streams=50))
    async with c:
        await eventually(lambda: _done(sorted(c.ended) == sorted(streams)))
    assert sum(_CountingLeases.batches) == 30, _CountingLeases.batches
    assert len(_CountingLeases.batches) <= 3, f"one call per intake read: {_CountingLeases.batches}"
    assert await redis.zcard(Keys(service).leases) == 0, "finishing removed each lease"


async def _done(value: bool) -> bool:
    return value


async def test_the_sweep_wakes_at_a_lease_deadline_not_at_its_interval(
    redis: AsyncRedis, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    """A dead owner's lease falls due 1 s from now; the sweep's interval is 30 s and
    neither notifications nor the scan can help: the sweep sleeps until the deadline."""
    stream = f"d:{uid}"
    [aid] = await strand(redis, service, [stream], "ghost")
    keys = Keys(service)
    now_s, now_us = await redis.time()
    await redis.zadd(keys.leases, {aid: now_s * 1000 + now_us // 1000 + 1000})
    recovery = RecoveryConfig(
        interval_s=600,
        min_idle_s=600,
        lease_check_interval_s=30,
        configure_keyspace_events=False,
    )
    c = consumer_factory(Recorder, recovery=recovery)
    started = time.monotonic()
    async with c:

        async def recovered() -> bool:
            return c.ended == [stream]

        await eventually(recovered, timeout_s=25)
    took = time.monotonic() - started
    assert took < 15, f"recovered after {took:.1f}s: the sweep waited for its interval"
    assert (await redis.xpending(keys.assignments, service))["pending"] == 0
