"""Input that can never be run, against real Redis: poison assignments are
dead-lettered as unparseable while intake goes on, and the producer refuses the names
under the framework's own key prefix."""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio import Redis as AsyncRedis

from streamjobs import ConsumerConfig, DeadLetterReason, InvalidStreamName, Producer, RecoveryConfig
from streamjobs._keys import Keys
from tests.harness.plugin import ConsumerFactory

from ._helpers import Recorder, assert_nothing_held, dead_letters, eventually

pytestmark = pytest.mark.anyio

FAST = ConsumerConfig(lock_ttl_s=2, read_block_ms=50, handler_backoff_s=0.01)
RECOVERY = RecoveryConfig(min_idle_s=3, interval_s=1)


async def test_poison_assignments_are_dead_lettered_and_intake_goes_on(
    redis: AsyncRedis, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    keys = Keys(service)
    c = consumer_factory(Recorder, config=FAST, recovery=RECOVERY)
    good = f"data:{uid}"
    bad: list[dict[str, Any]] = [
        {"stream": f"s:{uid}", "info": "[" * 100_000},  # RecursionError in json
        {"stream": keys.assignments},  # would consume the assignments as data
        {"stream": keys.lock(f"x:{uid}")},
    ]
    async with c:
        for fields in bad:
            await redis.xadd(keys.assignments, fields)
        producer = Producer(redis, service=service)
        await producer.add_stream(good)
        await producer.append(good, {"n": "0"})
        await producer.close_stream(good)

        async def done() -> bool:
            return good in c.ended and await redis.xlen(keys.dead_letters) == len(bad)

        await eventually(done)
    records = await dead_letters(redis, service)
    assert {r.reason for r in records} == {DeadLetterReason.UNPARSEABLE}
    assert "RecursionError" in records[0].error
    assert all("reserved" in r.error for r in records[1:])
    assert await redis.exists(keys.assignments) == 1  # not deleted by a "finish"
    await assert_nothing_held(redis, service, [good])


async def test_the_producer_refuses_reserved_names(redis: AsyncRedis, service: str) -> None:
    producer = Producer(redis, service=service)
    keys = Keys(service)
    for call in (
        producer.add_stream(keys.dead_letters),
        producer.append(keys.leases, {"n": "1"}),
        producer.close_stream(keys.lock("x")),
    ):
        with pytest.raises(InvalidStreamName, match="reserved"):
            await call
