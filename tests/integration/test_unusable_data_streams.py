"""A data stream deleted while owned, or a key of another type where it should be,
against real Redis: its assignment completes or is dead-lettered as unusable, within
seconds even while the stream was idle, and no other stream waits for it (the runtime's
side over the in-memory gateway: tests/unit/test_unusable_data_streams.py)."""

from __future__ import annotations

import json

import pytest
from redis.asyncio import Redis as AsyncRedis

from streamjobs import ConsumerConfig, DeadLetterReason, Producer, RecoveryConfig
from streamjobs._keys import Keys
from streamjobs.metrics import StreamEvent
from tests.harness.plugin import ConsumerFactory

from ._helpers import Recorder, assert_nothing_held, dead_letters, eventually, true

pytestmark = pytest.mark.anyio

FAST = ConsumerConfig(lock_ttl_s=2, read_block_ms=50, handler_backoff_s=0.01)
RECOVERY = RecoveryConfig(min_idle_s=3, interval_s=1)


async def test_a_data_stream_of_the_wrong_type_is_dead_lettered(
    redis: AsyncRedis, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    stream = f"data:{uid}"
    await redis.set(stream, "not a stream")
    c = consumer_factory(Recorder, config=FAST, recovery=RECOVERY)
    async with c:
        await Producer(redis, service=service).add_stream(stream, {"k": 1})

        async def dead() -> bool:
            return await redis.xlen(Keys(service).dead_letters) == 1

        await eventually(dead)
    [record] = await dead_letters(redis, service)
    assert record.reason is DeadLetterReason.UNUSABLE_STREAM
    assert record.error.startswith("WrongKeyType: ")
    assert "WRONGTYPE" in record.error
    assert json.loads(record.fields["info"]) == {"k": 1}
    assert await redis.get(stream) == b"not a stream"
    assert await redis.xlen(Keys(service).assignments) == 0
    await assert_nothing_held(redis, service, [stream])


async def test_a_data_stream_deleted_while_owned_frees_everything(
    redis: AsyncRedis, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    stream = f"data:{uid}"
    producer = Producer(redis, service=service)
    c = consumer_factory(Recorder, config=FAST, recovery=RECOVERY)
    async with c:
        await producer.add_stream(stream)
        await producer.append(stream, {"n": "0"})

        async def handled() -> bool:
            return len(c.handled) == 1

        await eventually(handled)
        await redis.delete(stream)
        await producer.append(stream, {"n": "1"})  # a new, group-less stream of that name

        async def freed() -> bool:
            return not c.owned_streams and stream in c.ended

        await eventually(freed)
    assert c.lost == []
    await assert_nothing_held(redis, service, [stream])
    assert await redis.xlen(Keys(service).assignments) == 0


async def test_a_stream_deleted_while_owned_and_idle_is_released_within_seconds(
    redis: AsyncRedis, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    """The shared idle wait checks that its streams still exist; without that, an idle
    stream noticed its deletion only at its safety re-read, 150 to 300 s later."""
    stream = f"d:{uid}"
    keys = Keys(service)
    producer = Producer(redis, service=service)
    await producer.add_stream(stream)
    await producer.append(stream, {"n": "0"})
    c = consumer_factory(Recorder, config=ConsumerConfig(read_block_ms=500))
    async with c:
        await eventually(lambda: true(len(c.handled) == 1))
        await redis.delete(stream)

        async def released() -> bool:
            pending: int = (await redis.xpending(keys.assignments, service))["pending"]
            return pending == 0 and not await redis.exists(keys.lock(stream))

        # read_block_ms + the 2 s check + a fenced read, with room for a slow machine.
        await eventually(released, timeout_s=8)
        assert c.statistics().stream_events.get(StreamEvent.VANISHED.value) == 1
    assert await redis.xlen(keys.assignments) == 0
    assert await redis.hget(keys.active, stream) is None


async def test_a_stream_replaced_by_another_type_while_idle_stalls_no_other_stream(
    redis: AsyncRedis, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    """A key of another type where an idle owned stream was makes the shared wait's
    XREAD fail (WRONGTYPE) for every stream in it. Each stream then reads by itself:
    the one at fault is dead-lettered as unusable, the others keep getting entries.
    Before, all of them slept until their safety re-read, 150 to 300 s later."""
    bad, good = f"d:{uid}:bad", f"d:{uid}:good"
    keys = Keys(service)
    producer = Producer(redis, service=service)
    for stream in (bad, good):
        await producer.add_stream(stream)
        await producer.append(stream, {"n": "0"})
    c = consumer_factory(Recorder, config=ConsumerConfig(read_block_ms=500))
    async with c:
        await eventually(lambda: true(len(c.handled) == 2))
        # DEL and SET at once: the DEL's event wakes the stream on a cluster (a SET
        # publishes in a class the waiter does not subscribe to), and no read sees
        # the key missing in between (a vanished stream is another path).
        await redis.eval(
            "redis.call('DEL', KEYS[1]) return redis.call('SET', KEYS[1], ARGV[1])",
            1,
            bad,
            "not a stream",
        )
        await producer.append(good, {"n": "1"})

        async def both_moved_on() -> bool:
            handled = [(s, n) for _, s, _, n in c.handled]
            return (good, "1") in handled and await redis.xlen(keys.dead_letters) == 1

        await eventually(both_moved_on, timeout_s=10)
        [(_, letter)] = list(await redis.xrange(keys.dead_letters) or [])
        assert letter[b"_dlq_reason"] == b"unusable_stream"
        assert letter[b"stream"] == bad.encode()
        await producer.append(good, {"n": "2"})
        await eventually(lambda: true(len(c.handled) == 4), timeout_s=5)
    assert not await redis.exists(keys.lock(bad))
