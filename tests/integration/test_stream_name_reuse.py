"""A stream name used again for the next job: within the finished job's retention, and
after a job that ended early by ``finish()``, the next job of the name gets its own
entries and nothing the earlier one left."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis as AsyncRedis

from streamjobs import ConsumerConfig, Message, Producer, RecoveryConfig
from streamjobs._keys import Keys
from tests.harness.plugin import ConsumerFactory

from ._helpers import Recorder, eventually, true

pytestmark = pytest.mark.anyio

RECOVERY = RecoveryConfig(min_idle_s=3, interval_s=1)


async def test_a_stream_name_reused_within_its_retention_loses_nothing(
    redis: AsyncRedis, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    stream = f"data:{uid}"
    producer = Producer(redis, service=service)
    config = ConsumerConfig(lock_ttl_s=2, read_block_ms=50, finished_stream_ttl_s=2)
    c = consumer_factory(Recorder, config=config, recovery=RECOVERY)
    async with c:
        for job in range(2):
            await producer.add_stream(stream, {"job": job})
            assert await redis.ttl(stream) in (-1, -2), "the old retention survived"
            for i in range(4):
                await producer.append(stream, {"n": f"{job}.{i}"})
            await producer.close_stream(stream)

            async def ended(job: int = job) -> bool:
                return c.ended.count(stream) == job + 1

            await eventually(ended)
            assert await redis.pttl(stream) > 0  # the retention of the job just finished
    assert [h[3] for h in c.handled] == [f"{j}.{i}" for j in range(2) for i in range(4)]


class _FinishesEarly(Recorder):
    async def handle(self, message: Message) -> None:
        await super().handle(message)
        if message.fields.get("n") == "2":
            self.finish(message.stream)


async def test_finish_leaves_nothing_for_the_next_job_of_the_same_name(
    redis: AsyncRedis, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    stream = f"d:{uid}"
    keys = Keys(service)
    producer = Producer(redis, service=service)
    await producer.add_stream(stream)
    for i in range(10):
        await producer.append(stream, {"n": str(i)})
    await producer.close_stream(stream)
    c = consumer_factory(_FinishesEarly, config=ConsumerConfig(read_block_ms=200))
    async with c:
        await eventually(lambda: true(c.ended == [stream]))
        assert [n for _, _, _, n in c.handled] == ["0", "1", "2"]
        await producer.add_stream(stream)
        await producer.append(stream, {"n": "job2"})
        await producer.close_stream(stream)
        await eventually(lambda: true(c.ended == [stream, stream]))
    assert [n for _, _, _, n in c.handled] == ["0", "1", "2", "job2"]
    assert (await redis.xpending(stream, service))["pending"] == 0
    assert await redis.exists(keys.lock(stream)) == 0
