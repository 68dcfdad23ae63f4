"""Assignments in the Go library's form (one ``lbs-input`` field holding
``{"DataStreamName": ..., "Info": {...}}``) run end to end, including after a
recovery re-queue, which keeps the form: what MIGRATION.md's cut-over relies on."""

from __future__ import annotations

import json
from typing import Any

import pytest

from streamjobs import ConsumerConfig, Producer, RecoveryConfig
from streamjobs._keys import Keys
from tests.harness.plugin import ConsumerFactory

from ._helpers import Recorder, eventually

pytestmark = pytest.mark.anyio


class Infos(Recorder):
    infos: dict[str, Any]

    async def on_stream_start(self, stream: str, info: Any) -> None:
        await super().on_stream_start(stream, info)
        self.infos = {**getattr(self, "infos", {}), stream: dict(info)}


async def test_go_form_assignments_run_and_survive_a_recovery(
    redis: Any, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    keys = Keys(service)
    producer = Producer(redis, service=service)
    fresh, orphan = f"go:{uid}:fresh", f"go:{uid}:orphan"
    await redis.xgroup_create(keys.assignments, service, id="0", mkstream=True)
    for stream in (orphan, fresh):
        # As a Go producer writes it (field names in any case: Go's decoder ignores it).
        body = {"dataStreamName": stream, "Info": {"tenant": "acme", "n": 2}}
        await redis.xadd(keys.assignments, {"lbs-input": json.dumps(body)})
        for n in range(3):
            await producer.append(stream, {"n": str(n)})
        await producer.close_stream(stream)
    # The orphan was read by a consumer that died before taking its lock.
    await redis.xreadgroup(service, "dead-go-consumer", {keys.assignments: ">"}, count=1)
    consumer = consumer_factory(
        Infos,
        config=ConsumerConfig(lock_ttl_s=1, read_block_ms=50),
        recovery=RecoveryConfig(min_idle_s=1.5, interval_s=0.5, lease_check_interval_s=0.2),
    )
    async with consumer:

        async def both_ended() -> bool:
            return sorted(consumer.ended) == sorted([fresh, orphan])

        await eventually(both_ended, timeout_s=30)
    assert consumer.infos == {
        fresh: {"tenant": "acme", "n": 2},
        orphan: {"tenant": "acme", "n": 2},
    }
    handled = sorted((h[1], h[3]) for h in consumer.handled)
    assert handled == sorted((s, str(n)) for s in (fresh, orphan) for n in range(3))
    assert await redis.xlen(keys.assignments) == 0
    assert await redis.xlen(keys.dead_letters) == 0
