"""A job is its own (docs/design.md#job-identity), against real Redis: what is appended
to a stream after its job ended early belongs to that job, never to the next job of
the same name; a cancel that comes when the job is over leaves nothing behind; an owner
that died after ending its job early leaves a job that is only completed."""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio import Redis as AsyncRedis

from streamjobs import (
    ConsumerConfig,
    DeadLetter,
    DeadLetterFilter,
    Message,
    Producer,
    RecoveryConfig,
)
from streamjobs._keys import Keys
from streamjobs._redis import ACQUIRED, ACQUIRED_ENDED, Gateway
from streamjobs.dlq import DeadLetters
from tests.harness.plugin import ConsumerFactory

from ._helpers import Recorder, eventually

pytestmark = pytest.mark.anyio

FAST = ConsumerConfig(read_block_ms=200)


async def _true(value: bool) -> bool:
    return value


class _FinishesEarly(Recorder):
    """Finishes its stream after the entry ``n=stop``; rejects ``n=reject`` unless it
    is a replay."""

    async def handle(self, message: Message) -> None:
        n = message.fields.get("n")
        if n == "reject" and message.replayed_from is None:
            raise DeadLetter(reason="not yet")
        await super().handle(message)
        if n == "stop":
            self.finish(message.stream)


def _ns(c: Recorder) -> list[str]:
    return [n for _, _, _, n in c.handled]


async def test_entries_appended_after_an_early_finish_never_reach_the_next_job(
    redis: AsyncRedis, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    stream = f"d:{uid}"
    producer = Producer(redis, service=service)
    await producer.add_stream(stream)
    for n in ("0", "stop", "2"):
        await producer.append(stream, {"n": n})
    c = consumer_factory(_FinishesEarly, config=FAST)
    async with c:
        await eventually(lambda: _true(c.ended == [stream]))
        # The first job's producer does not know it ended: it goes on, and closes it.
        await producer.append(stream, {"n": "late"})
        await producer.close_stream(stream)
        await producer.add_stream(stream)
        await producer.append(stream, {"n": "job2"})
        await producer.close_stream(stream)
        await eventually(lambda: _true(c.ended == [stream, stream]))
    assert _ns(c) == ["0", "stop", "job2"]
    assert (await redis.xpending(stream, service))["pending"] == 0
    assert not await redis.exists(Keys(service).ended(stream)), "the next job consumed it"


async def test_entries_appended_after_a_queued_job_was_cancelled_are_skipped(
    redis: AsyncRedis, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    stream = f"d:{uid}"
    producer = Producer(redis, service=service)
    await producer.add_stream(stream)
    await producer.append(stream, {"n": "old"})
    assert (await producer.cancel_stream(stream)).name == "REMOVED"
    await producer.append(stream, {"n": "late"})
    await producer.close_stream(stream)
    await producer.add_stream(stream)
    await producer.append(stream, {"n": "job2"})
    await producer.close_stream(stream)
    c = consumer_factory(Recorder, config=FAST)
    async with c:
        await eventually(lambda: _true(c.ended == [stream]))
    assert _ns(c) == ["job2"]


async def test_a_cancel_that_comes_as_the_job_ends_normally_leaves_no_marker(
    redis: AsyncRedis, service: str, uid: str
) -> None:
    """The owner read the end marker and sealed, and still holds the lock (it completes
    the assignment next): a cancel then is moot. Written, its marker would outlive the
    job for a day, and a replay into the stream would be refused as 'ending'."""
    stream = f"d:{uid}"
    keys = Keys(service)
    gw = Gateway(redis, keys)
    await gw.ensure_group()
    producer = Producer(redis, service=service)
    aid = await producer.add_stream(stream)
    await producer.append(stream, {"n": "0"})
    await producer.close_stream(stream)
    await redis.xreadgroup(service, "owner", {keys.assignments: ">"}, count=1)
    assert await gw.acquire(stream, "owner:1", 60_000, job=aid) == ACQUIRED
    reply = await gw.fenced_read(stream, "owner:1", "owner", 10, [])
    assert len(reply.entries) == 2, reply
    assert await gw.seal(stream, "owner:1", -1, [e[0] for e in reply.entries], job=aid)
    await producer.cancel_stream(stream, "too late")
    assert not await redis.exists(keys.cancel(stream))
    assert await redis.xlen(stream) == 2, "no end-with-cancel entry either"


async def test_an_owner_that_died_after_ending_its_job_early_leaves_it_only_to_complete(
    redis: AsyncRedis, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    stream = f"d:{uid}"
    keys = Keys(service)
    gw = Gateway(redis, keys)
    await gw.ensure_group()
    producer = Producer(redis, service=service)
    aid = await producer.add_stream(stream)
    await producer.append(stream, {"n": "0"})
    await redis.xreadgroup(service, "ghost", {keys.assignments: ">"}, count=1)
    assert await gw.acquire(stream, "ghost:1", 60_000, job=aid) == ACQUIRED
    # It ended the job early (seal with skip) and died before completing it.
    assert await gw.seal(stream, "ghost:1", -1, cancelled=True, job=aid)
    await redis.delete(keys.lock(stream))
    await producer.append(stream, {"n": "late"})  # its producer goes on
    c = consumer_factory(
        Recorder,
        config=ConsumerConfig(read_block_ms=200, lock_ttl_s=1.0),
        recovery=RecoveryConfig(min_idle_s=1.5, interval_s=0.5, lease_check_interval_s=0.2),
    )
    async with c:

        async def completed() -> bool:
            return await redis.xlen(keys.assignments) == 0 and not await redis.exists(
                keys.lock(stream)
            )

        await eventually(completed)
    assert c.handled == [], "the job had ended: nothing of it is handled again"
    assert c.started == [], "nor does it start again"
    # A client retry of that acquire (its reply lost) would find the same.
    assert await gw.acquire(stream, "again:1", 60_000, job=aid) == ACQUIRED_ENDED


async def test_a_replay_into_a_stream_whose_job_ended_early_skips_the_leftovers(
    redis: AsyncRedis, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    stream = f"d:{uid}"
    producer = Producer(redis, service=service)
    await producer.add_stream(stream, {"job": 1})
    for n in ("reject", "stop"):
        await producer.append(stream, {"n": n})
    c = consumer_factory(_FinishesEarly, config=FAST)
    async with c:
        await eventually(lambda: _true(c.ended == [stream]))
        await producer.append(stream, {"n": "late"})
        letters = DeadLetters(redis, service=service)
        report = await letters.replay(DeadLetterFilter(reason="not yet"))
        assert len(report.replayed) == 1, report
        await eventually(lambda: _true(len(c.ended) == 2))
    assert _ns(c) == ["stop", "reject"]


class _Plain(Recorder):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)


async def test_an_early_end_in_one_service_leaves_another_services_job_alone(
    redis: AsyncRedis, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    stream = f"d:{uid}"
    other = f"{service}-b"
    await Producer(redis, service=service).add_stream(stream)
    await Producer(redis, service=other).add_stream(stream)
    producer = Producer(redis, service=service)
    for n in ("0", "stop", "2"):
        await producer.append(stream, {"n": n})
    a = consumer_factory(_FinishesEarly, config=FAST)
    b = consumer_factory(_Plain, config=FAST, service=other)
    async with a, b:
        await eventually(lambda: _true(a.ended == [stream]))
        await producer.append(stream, {"n": "3"})
        await producer.close_stream(stream)
        await eventually(lambda: _true(b.ended == [stream]))
    assert _ns(a) == ["0", "stop"]
    assert _ns(b) == ["0", "stop", "2", "3"], "service B's job is not A's to end"
    assert await redis.exists(Keys(service).ended(stream))
    assert not await redis.exists(Keys(other).ended(stream))
