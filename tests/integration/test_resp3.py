"""Clients made with ``protocol=3`` (RESP3) work end to end: a consumer, the producer,
the recovery of a dead owner's assignment, the Inspector and the DLQ tools; standalone
and on the cluster (docs/compatibility.md#clients)."""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio import Redis as AsyncRedis
from redis.asyncio.cluster import RedisCluster

from streamjobs import (
    ConsumerConfig,
    DeadLetter,
    DeadLetters,
    Inspector,
    Message,
    Producer,
    RecoveryConfig,
)
from streamjobs._keys import Keys
from tests.harness.plugin import ConsumerFactory

from ._helpers import Recorder, eventually

pytestmark = pytest.mark.anyio


class Refusing(Recorder):
    async def handle(self, message: Message) -> None:
        await super().handle(message)
        if message.fields.get("n") == "bad":
            raise DeadLetter("refused")


async def test_a_resp3_client_runs_everything(
    request: pytest.FixtureRequest,
    redis: Any,
    service: str,
    uid: str,
    consumer_factory: ConsumerFactory,
) -> None:
    if isinstance(redis, RedisCluster):
        client: Any = RedisCluster.from_url(
            request.getfixturevalue("redis_cluster").url, protocol=3
        )
    else:
        client = AsyncRedis.from_url(request.getfixturevalue("redis_url"), protocol=3)
    try:
        keys = Keys(service)
        producer = Producer(client, service=service)
        streams = [f"r3:{uid}:{i}" for i in range(3)]
        for stream in streams:
            await producer.add_stream(stream, {"k": 1})
            await producer.append(stream, {"n": "0"})
            await producer.append(stream, {"n": "bad"})
            await producer.close_stream(stream)
        # A dead owner's assignment: recovery must re-queue it (read over RESP3 too).
        await client.xgroup_create(keys.assignments, service, id="0", mkstream=True)
        await client.xreadgroup(service, "dead", {keys.assignments: ">"}, count=1)
        consumer = consumer_factory(
            Refusing,
            client,
            config=ConsumerConfig(lock_ttl_s=1, read_block_ms=50),
            recovery=RecoveryConfig(min_idle_s=1.5, interval_s=0.5, lease_check_interval_s=0.2),
        )
        async with consumer:

            async def all_ended() -> bool:
                return sorted(consumer.ended) == sorted(streams)

            await eventually(all_ended, timeout_s=30)
            overview = await Inspector(client, service=service).overview()
            assert overview.dlq.by_reason == {"rejected": 3}
            assert [c.name for c in overview.consumers if c.alive] == [consumer.consumer_name]
        assert sorted(h[3] for h in consumer.handled) == ["0", "0", "0", "bad", "bad", "bad"]
        letters = DeadLetters(client, service=service)
        records = await letters.list()
        assert [r.fields for r in records] == [{"n": "bad"}] * 3
        assert await letters.purge([r.id for r in records]) == [r.id for r in records]
        assert await client.xlen(keys.assignments) == 0
    finally:
        await client.aclose()
