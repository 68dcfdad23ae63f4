from __future__ import annotations

import pytest
from redis.asyncio import Redis as AsyncRedis

from streamjobs import ConsumerConfig, Producer, RecoveryConfig
from streamjobs._keys import Keys
from tests.harness.plugin import ConsumerFactory

from ._helpers import Recorder, eventually

pytestmark = pytest.mark.anyio


async def test_one_stream_end_to_end(
    redis: AsyncRedis, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    producer = Producer(redis, service=service)
    stream = f"data:{uid}:0"
    for i in range(5):
        await producer.append(stream, {"n": str(i)})
    await producer.close_stream(stream)
    await producer.add_stream(stream, {"k": "v"})
    c = consumer_factory(
        Recorder,
        config=ConsumerConfig(lock_ttl_s=2, read_block_ms=50),
        recovery=RecoveryConfig(min_idle_s=3),
    )
    async with c:

        async def done() -> bool:
            return stream in c.ended

        await eventually(done, timeout_s=10)
    assert [h[3] for h in c.handled] == ["0", "1", "2", "3", "4"]
    assert await redis.exists(Keys(service).lock(stream)) == 0
