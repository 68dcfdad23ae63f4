"""Limits on what one assignment may hold, against real Redis: a stream that never
gets an entry is abandoned instead of holding a slot (and an empty key) forever."""

from __future__ import annotations

from typing import Any

import pytest

from streamjobs import ConsumerConfig, DeadLetterReason, Producer, RecoveryConfig
from streamjobs._deadletter import parse_dead_letter
from streamjobs._keys import Keys
from tests.harness.plugin import ConsumerFactory

from ._helpers import Recorder, eventually

pytestmark = pytest.mark.anyio


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


async def test_a_stream_that_never_gets_an_entry_is_abandoned_and_frees_its_slot(
    redis: Any, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    keys = Keys(service)
    silent, real = f"silent:{uid}", f"real:{uid}"
    producer = Producer(redis, service=service)
    await producer.add_stream(silent)  # nobody ever writes to it
    await producer.add_stream(real)  # queued behind it: one slot only
    await producer.append(real, {"n": "0"})
    await producer.close_stream(real)
    config = ConsumerConfig(
        max_concurrent_streams=1,
        stream_idle_timeout_s=0.5,
        read_block_ms=50,
        finished_stream_ttl_s=60,
    )
    consumer = consumer_factory(Recorder, config=config, recovery=RecoveryConfig())
    async with consumer:

        async def real_done() -> bool:
            return consumer.ended == [real]

        await eventually(real_done)
    records = [
        parse_dead_letter(_text(i), {_text(k): _text(v) for k, v in f.items()})
        for i, f in await redis.xrange(keys.dead_letters)
    ]
    assert [(r.reason, r.source_stream, r.fields.get("stream")) for r in records] == [
        (DeadLetterReason.IDLE_TIMEOUT, keys.assignments, silent)
    ]
    assert "no entry for 0.5s" in records[0].error
    assert [h[1:] for h in consumer.handled] == [(real, consumer.handled[0][2], "0")]
    # Nothing held, nothing pending, and no empty key kept for good.
    assert await redis.exists(keys.lock(silent)) == 0
    assert (await redis.xpending(keys.assignments, service))["pending"] == 0
    assert await redis.zcard(keys.leases) == 0
    assert await redis.hlen(keys.active) == 0
    ttl = await redis.pttl(silent)
    assert ttl == -2 or 0 < ttl <= 60_000, f"the abandoned stream kept no retention: {ttl}"


async def test_a_huge_bad_assignment_is_logged_in_bounded_lines(
    redis: Any,
    service: str,
    uid: str,
    consumer_factory: ConsumerFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """1 MB values in bad assignments: dead-lettered with their reason, and no log
    line quoting them is longer than a few KB."""
    keys = Keys(service)
    mb = 1024 * 1024
    bad: list[dict[str, str]] = [
        {"stream": "s" * mb},
        {"stream": f"s:{uid}", "_retry_count": "x" * mb},
        {"stream": f"s:{uid}", "info": "{" + "x" * mb},
    ]
    for fields in bad:
        await redis.xadd(keys.assignments, fields)
    consumer = consumer_factory(Recorder, config=ConsumerConfig(read_block_ms=50))
    async with consumer:

        async def all_dead() -> bool:
            return int(await redis.xlen(keys.dead_letters)) == len(bad)

        await eventually(all_dead)
    records = [
        parse_dead_letter(_text(i), {_text(k): _text(v) for k, v in f.items()})
        for i, f in await redis.xrange(keys.dead_letters)
    ]
    assert [r.reason for r in records] == [DeadLetterReason.UNPARSEABLE] * len(bad)
    assert "the most is 1024" in records[0].error
    logged = [r.getMessage() for r in caplog.records if r.name.startswith("streamjobs")]
    assert any("unparseable" in m for m in logged)
    assert max(len(m) for m in logged) < 4096, "a log line quoted a huge value"
