"""Submitting a stream twice (docs/design.md#submission, docs/recovery.md#duplicate-submissions).

Before: a second ``add_stream`` of an unfinished stream queued a second assignment.
While the first owner lived it was re-queued every heartbeat interval (the lock was
held); once the owner finished, it took the finished stream and waited forever (its
end marker had already been acked), keeping the lock and the assignment.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest
from redis.asyncio import Redis as AsyncRedis

from streamjobs import (
    ConsumerConfig,
    Message,
    Producer,
    RecoveryConfig,
    RequeueOutcome,
    WrongKeyType,
)
from streamjobs._keys import Keys
from streamjobs._redis import Gateway
from tests.harness.plugin import ConsumerFactory

from ._helpers import Recorder, eventually

pytestmark = pytest.mark.anyio

FAST = ConsumerConfig(lock_ttl_s=2, read_block_ms=50, handler_backoff_s=0.01)
# Recovery that stays out of the way for the length of a test.
NO_RECOVERY = RecoveryConfig(min_idle_s=300, interval_s=300, lease_check_interval_s=300)


async def index(redis: Any, keys: Keys) -> dict[str, str]:
    """The active-assignment index: data stream -> assignment id."""
    raw = await redis.hgetall(keys.active)
    return {k.decode(): v.decode() for k, v in raw.items()}


async def lbs(redis: Any, keys: Keys) -> list[str]:
    """Ids of the entries in the assignment stream, oldest first."""
    return [i.decode() for i, _ in await redis.xrange(keys.assignments)]


async def take(redis: Any, keys: Keys, consumer: str) -> list[str]:
    """Read every new assignment as ``consumer`` (an owner that then dies: no lock)."""
    await Gateway(redis, keys).assignments.ensure_group()
    reply: Any = await redis.xreadgroup(keys.group, consumer, {keys.assignments: ">"}, count=100)
    return [i.decode() for i, _ in reply[0][1]] if reply else []


async def test_a_second_add_of_an_unfinished_stream_returns_the_first_assignment(
    redis: AsyncRedis, service: str, uid: str
) -> None:
    keys = Keys(service)
    producer = Producer(redis, service=service)
    stream = f"d:{uid}"
    first = await producer.add_stream(stream, {"job": 1})
    assert await producer.add_stream(stream, {"job": 2}) == first, "not yet delivered"
    assert await take(redis, keys, "owner") == [first]
    assert await producer.add_stream(stream) == first, "pending with its owner"
    assert await lbs(redis, keys) == [first], "a duplicate was queued"
    [(_, fields)] = list(await redis.xrange(keys.assignments) or [])
    assert json.loads(fields[b"info"]) == {"job": 1}, "the first submission's info stays"
    assert await index(redis, keys) == {stream: first}
    other = await producer.add_stream(f"e:{uid}")
    assert other != first
    assert await index(redis, keys) == {stream: first, f"e:{uid}": other}


async def test_a_finished_stream_gets_a_new_assignment(
    redis: AsyncRedis, service: str, uid: str
) -> None:
    keys = Keys(service)
    producer = Producer(redis, service=service)
    stream = f"d:{uid}"
    first = await producer.add_stream(stream)
    await take(redis, keys, "owner")
    assert await Gateway(redis, keys).assignments.finish(first)
    assert await redis.exists(keys.active) == 0, "finish left the index entry"
    second = await producer.add_stream(stream)
    assert second != first
    assert await lbs(redis, keys) == [second]
    assert await index(redis, keys) == {stream: second}


async def test_the_index_follows_a_recovery_requeue(
    redis: AsyncRedis, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    keys = Keys(service)
    producer = Producer(redis, service=service)
    stream = f"d:{uid}"
    first = await producer.add_stream(stream)
    await take(redis, keys, "ghost")
    c = consumer_factory(Recorder, recovery=RecoveryConfig(max_retries=3))
    assert await c.claim(first) is RequeueOutcome.REQUEUED
    [moved] = await lbs(redis, keys)
    assert moved != first
    assert await index(redis, keys) == {stream: moved}
    assert await producer.add_stream(stream) == moved
    assert await lbs(redis, keys) == [moved]


async def test_dead_lettering_clears_the_index(
    redis: AsyncRedis, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    keys = Keys(service)
    producer = Producer(redis, service=service)
    stream = f"d:{uid}"
    first = await producer.add_stream(stream)
    await take(redis, keys, "ghost")
    c = consumer_factory(Recorder, recovery=RecoveryConfig(max_retries=0))
    assert await c.claim(first) is RequeueOutcome.DEAD_LETTERED
    assert await redis.exists(keys.active) == 0, "dead-lettering left the index entry"
    second = await producer.add_stream(stream)
    assert second != first
    assert await lbs(redis, keys) == [second]


class Slow(Recorder):
    async def handle(self, message: Message) -> None:
        await anyio.sleep(0.02)  # slow on purpose: entries stay in flight a while
        await super().handle(message)


async def test_the_index_follows_a_graceful_hand_back(
    redis: AsyncRedis, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    keys = Keys(service)
    producer = Producer(redis, service=service)
    stream = f"d:{uid}"
    first = await producer.add_stream(stream)
    for i in range(60):
        await producer.append(stream, {"n": str(i)})
    await producer.close_stream(stream)
    a = consumer_factory(Slow, config=FAST, recovery=NO_RECOVERY)
    async with a:

        async def started() -> bool:
            return len(a.handled) >= 3

        await eventually(started)
    assert stream not in a.ended
    assert await redis.exists(keys.lock(stream)) == 0
    [moved] = await lbs(redis, keys)
    assert moved != first, "the hand-back re-queues under a new id"
    assert await index(redis, keys) == {stream: moved}
    assert await producer.add_stream(stream) == moved
    assert await lbs(redis, keys) == [moved]


async def test_other_assignments_of_the_stream_leave_the_index_alone(
    redis: AsyncRedis, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    """An assignment written by other means (a raw XADD) is not deduplicated, and
    re-queueing, dead-lettering or finishing it never moves the index."""
    keys = Keys(service)
    producer = Producer(redis, service=service)
    gw = Gateway(redis, keys)
    stream = f"d:{uid}"
    raw = (await redis.xadd(keys.assignments, {"stream": stream, "info": "{}"})).decode()
    first = await producer.add_stream(stream)
    assert first != raw, "a raw assignment is not deduplicated"
    dup = (await redis.xadd(keys.assignments, {"stream": stream, "info": "{}"})).decode()
    assert await take(redis, keys, "ghost") == [raw, first, dup]
    assert await gw.assignments.finish(raw)
    moved = await gw.assignments.requeue(dup, 1)
    assert moved is not None
    assert await index(redis, keys) == {stream: first}
    await take(redis, keys, "ghost")
    c = consumer_factory(Recorder, recovery=RecoveryConfig(max_retries=1))
    assert await c.claim(moved) is RequeueOutcome.DEAD_LETTERED
    assert await index(redis, keys) == {stream: first}
    assert await producer.add_stream(stream) == first
    assert await gw.assignments.finish(first)
    assert await redis.exists(keys.active) == 0


async def test_idempotency_key_within_and_past_its_window(
    redis: AsyncRedis, service: str, uid: str
) -> None:
    keys = Keys(service)
    producer = Producer(redis, service=service)
    gw = Gateway(redis, keys)
    stream = f"d:{uid}"
    key = f"req-{uid}"
    first = await producer.add_stream(stream, idempotency_key=key, dedupe_window_s=60)
    assert 0 < await redis.pttl(keys.idempotency(key)) <= 60_000
    assert await producer.add_stream(stream, idempotency_key=key) == first
    await take(redis, keys, "owner")
    assert await gw.assignments.finish(first)
    await producer.append(stream, {"n": "0"})
    await redis.pexpire(stream, 60_000)  # the retention its release would set
    # Finished, but within the window: the same id, nothing queued, retention kept.
    assert await producer.add_stream(stream, idempotency_key=key) == first
    assert await lbs(redis, keys) == []
    assert await redis.pttl(stream) > 0, "a deduplicated submission cleared the retention"
    # Without the key it is a new job (and the old retention goes).
    second = await producer.add_stream(stream)
    assert second != first
    assert await redis.pttl(stream) == -1, "the old retention survived"
    # A new key while the stream is unfinished: the unfinished assignment, recorded.
    other = f"other-{uid}"
    assert await producer.add_stream(stream, idempotency_key=other) == second
    await take(redis, keys, "owner")
    assert await gw.assignments.finish(second)
    assert await producer.add_stream(stream, idempotency_key=other) == second
    # Past the window the key is forgotten: a new assignment.
    short = f"short-{uid}"
    third = await producer.add_stream(stream, idempotency_key=short, dedupe_window_s=0.2)
    await take(redis, keys, "owner")
    assert await gw.assignments.finish(third)
    assert await producer.add_stream(stream, idempotency_key=short, dedupe_window_s=0.2) == third
    assert await redis.pttl(keys.idempotency(short)) <= 200  # the 0.2 s window

    async def forgotten() -> bool:
        return not await redis.exists(keys.idempotency(short))

    await eventually(forgotten, timeout_s=5)
    fourth = await producer.add_stream(stream, idempotency_key=short, dedupe_window_s=0.2)
    assert fourth not in (first, second, third)
    assert await lbs(redis, keys) == [fourth]
    assert await index(redis, keys) == {stream: fourth}


async def test_a_wrong_type_index_fails_the_producer_and_nothing_else(
    redis: AsyncRedis, service: str, uid: str
) -> None:
    """add.lua checks every key's type before its first write; the scripts that maintain
    the index (finish, re-queue, dead-letter) skip an index that is not a hash."""
    keys = Keys(service)
    producer = Producer(redis, service=service)
    stream = f"d:{uid}"
    aid = await producer.add_stream(stream)
    await redis.set(keys.active, "not a hash")
    with pytest.raises(WrongKeyType):
        await producer.add_stream(f"e:{uid}")
    assert await lbs(redis, keys) == [aid], "written before the check"
    await take(redis, keys, "owner")
    assert await Gateway(redis, keys).assignments.finish(aid)
    assert await redis.get(keys.active) == b"not a hash"
    await redis.delete(keys.active)
    key = f"req-{uid}"
    await redis.hset(keys.idempotency(key), "x", "y")
    with pytest.raises(WrongKeyType):
        await producer.add_stream(stream, idempotency_key=key)
    assert await lbs(redis, keys) == []
    assert await redis.exists(keys.active) == 0


async def test_a_duplicate_submission_is_handled_once_and_leaves_nothing(
    redis: AsyncRedis, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    keys = Keys(service)
    producer = Producer(redis, service=service)
    stream = f"d:{uid}"
    c = consumer_factory(Recorder, config=FAST, recovery=RecoveryConfig(min_idle_s=3))
    async with c:
        first = await producer.add_stream(stream)
        for i in range(5):
            await producer.append(stream, {"n": str(i)})

        async def owned() -> bool:
            return len(c.handled) >= 1

        await eventually(owned)
        duplicate = await producer.add_stream(stream)  # while it is owned
        for i in range(5, 10):
            await producer.append(stream, {"n": str(i)})
        await producer.close_stream(stream)

        async def ended() -> bool:
            return stream in c.ended

        await eventually(ended)

        async def clean() -> bool:
            return (
                await redis.xlen(keys.assignments) == 0
                and await redis.exists(keys.active) == 0
                and await redis.exists(keys.lock(stream)) == 0
                and await redis.exists(keys.leases) == 0
                and (await redis.xpending(keys.assignments, service))["pending"] == 0
            )

        await eventually(clean, timeout_s=5)
        await anyio.sleep(2 * FAST.heartbeat_s)  # no duplicate turns up later
        assert await clean()
    assert duplicate == first
    assert [n for _, _, _, n in c.handled] == [str(i) for i in range(10)]
    assert len({i for _, _, i, _ in c.handled}) == 10, "an entry was handled twice"
    assert c.ended == [stream]
    assert c.lost == []
