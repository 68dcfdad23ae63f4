"""Ownership and recovery log lines carry ``service``, ``consumer``, ``stream`` and
``assignment_id`` as ``extra`` fields, for structured loggers."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from streamjobs import ConsumerConfig, Producer, RecoveryConfig
from streamjobs._keys import Keys
from tests.harness.plugin import ConsumerFactory

from ._helpers import Recorder, eventually

pytestmark = pytest.mark.anyio


async def test_recovery_and_ownership_lines_carry_their_context(
    redis: Any,
    service: str,
    uid: str,
    consumer_factory: ConsumerFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    keys = Keys(service)
    producer = Producer(redis, service=service)
    stream = f"orphan:{uid}"
    assignment_id = await producer.add_stream(stream)
    await producer.append(stream, {"n": "0"})
    await producer.close_stream(stream)
    # A consumer that read the assignment and died before taking the lock.
    await redis.xgroup_create(keys.assignments, service, id="0", mkstream=True)
    await redis.xreadgroup(service, "dead", {keys.assignments: ">"}, count=1)
    consumer = consumer_factory(
        Recorder,
        config=ConsumerConfig(lock_ttl_s=1, read_block_ms=50),
        recovery=RecoveryConfig(min_idle_s=1.5, interval_s=0.5, lease_check_interval_s=0.2),
    )
    caplog.set_level(logging.INFO, logger="streamjobs")
    async with consumer:

        async def finished() -> bool:
            return consumer.ended == [stream]

        await eventually(finished, timeout_s=30)

    def lines(start: str) -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.getMessage().startswith(start)]

    requeued = lines("re-queued assignment")
    assert requeued, caplog.text
    record = requeued[0]
    assert record.name == "streamjobs._recovery"
    assert (record.service, record.consumer, record.stream, record.assignment_id) == (  # type: ignore[attr-defined]
        service,
        consumer.consumer_name,
        stream,
        assignment_id,
    )
    resumed = lines("resumed stream")
    assert resumed, caplog.text
    assert resumed[0].name == "streamjobs._ownership"
    assert resumed[0].stream == stream  # type: ignore[attr-defined]
    assert resumed[0].assignment_id != assignment_id  # type: ignore[attr-defined]  # the copy
    assert resumed[0].consumer == consumer.consumer_name  # type: ignore[attr-defined]
