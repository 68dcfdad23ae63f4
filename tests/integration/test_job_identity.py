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
from streamjobs._redis import ACQUIRED, ACQUIRED_ENDED, ENDED_MARKER_TTL_MS, Gateway
from streamjobs.dlq import DeadLetters
from tests.harness.plugin import ConsumerFactory

from ._helpers import Recorder, eventually, true

pytestmark = pytest.mark.anyio

FAST = ConsumerConfig(read_block_ms=200)


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


async def _job(
    producer: Producer,
    stream: str,
    ns: tuple[str, ...] | list[str],
    info: dict[str, Any] | None = None,
    *,
    close: bool = False,
) -> str:
    """add_stream, then entries ``{"n": n}`` for each of ``ns`` (and the end marker)."""
    aid = await producer.add_stream(stream, info)
    for n in ns:
        await producer.append(stream, {"n": n})
    if close:
        await producer.close_stream(stream)
    return aid


async def test_entries_appended_after_an_early_finish_never_reach_the_next_job(
    redis: AsyncRedis, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    stream = f"d:{uid}"
    producer = Producer(redis, service=service)
    await _job(producer, stream, ("0", "stop", "2"))
    c = consumer_factory(_FinishesEarly, config=FAST)
    async with c:
        await eventually(lambda: true(c.ended == [stream]))
        # The first job's producer does not know it ended: it goes on, and closes it.
        await producer.append(stream, {"n": "late"})
        await producer.close_stream(stream)
        job2 = await producer.add_stream(stream)
        await producer.append(stream, {"n": "job2"})
        await producer.close_stream(stream)
        await eventually(lambda: true(c.ended == [stream, stream]))
    assert _ns(c) == ["0", "stop", "job2"]
    assert (await redis.xpending(stream, service))["pending"] == 0
    # Job 1's marker went when job 2 started; job 2's normal end left its own.
    assert await redis.get(Keys(service).ended(stream)) == f"n {job2}".encode()


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
        await eventually(lambda: true(c.ended == [stream]))
    assert _ns(c) == ["job2"]


async def _owned(
    redis: AsyncRedis, service: str, stream: str, *, close: bool
) -> tuple[Gateway, Producer, str]:
    """A job of one entry (``n=0``, and its end marker with ``close``) whose assignment
    consumer ``owner`` read and whose lock it took with token ``owner:1``."""
    keys = Keys(service)
    gw = Gateway(redis, keys)
    await gw.assignments.ensure_group()
    producer = Producer(redis, service=service)
    aid = await _job(producer, stream, ["0"], close=close)
    await redis.xreadgroup(service, "owner", {keys.assignments: ">"}, count=1)
    assert await gw.streams.acquire(stream, "owner:1", 60_000, job=aid) == ACQUIRED
    return gw, producer, aid


async def test_a_cancel_that_comes_as_the_job_ends_normally_leaves_no_marker(
    redis: AsyncRedis, service: str, uid: str
) -> None:
    """The owner read the end marker and sealed, and still holds the lock (it completes
    the assignment next): a cancel then is moot. Written, its marker would outlive the
    job for a day, and a replay into the stream would be refused as 'ending'."""
    stream = f"d:{uid}"
    keys = Keys(service)
    gw, producer, aid = await _owned(redis, service, stream, close=True)
    reply = await gw.streams.fenced_read(stream, "owner:1", "owner", 10, [])
    assert len(reply.entries) == 2, reply
    assert await gw.completion.seal(stream, "owner:1", -1, [e[0] for e in reply.entries], job=aid)
    await producer.cancel_stream(stream, "too late")
    assert not await redis.exists(keys.cancel(stream))
    assert await redis.xlen(stream) == 2, "no end-with-cancel entry either"


async def test_an_owner_that_died_after_ending_its_job_early_leaves_it_only_to_complete(
    redis: AsyncRedis, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    stream = f"d:{uid}"
    keys = Keys(service)
    gw, producer, aid = await _owned(redis, service, stream, close=False)
    # It ended the job early (seal with skip) and died before completing it.
    assert await gw.completion.seal(stream, "owner:1", -1, cancelled=True, job=aid)
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
    assert await gw.streams.acquire(stream, "again:1", 60_000, job=aid) == ACQUIRED_ENDED


async def test_a_replay_into_a_stream_whose_job_ended_early_skips_the_leftovers(
    redis: AsyncRedis, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    stream = f"d:{uid}"
    producer = Producer(redis, service=service)
    await _job(producer, stream, ("reject", "stop"), {"job": 1})
    c = consumer_factory(_FinishesEarly, config=FAST)
    async with c:
        await eventually(lambda: true(c.ended == [stream]))
        await producer.append(stream, {"n": "late"})
        letters = DeadLetters(redis, service=service)
        report = await letters.replay(DeadLetterFilter(reason="not yet"))
        assert len(report.replayed) == 1, report
        await eventually(lambda: true(len(c.ended) == 2))
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
        await eventually(lambda: true(a.ended == [stream]))
        await producer.append(stream, {"n": "3"})
        await producer.close_stream(stream)
        await eventually(lambda: true(b.ended == [stream]))
    assert _ns(a) == ["0", "stop"]
    assert _ns(b) == ["0", "stop", "2", "3"], "service B's job is not A's to end"
    assert (await redis.get(Keys(service).ended(stream)) or b"").startswith(b"e ")
    assert (await redis.get(Keys(other).ended(stream)) or b"").startswith(b"n ")


async def test_a_cancelled_never_read_job_leaves_its_stream_expiring(
    redis: AsyncRedis, service: str, uid: str
) -> None:
    """No consumer saw the job, so none applies the retention: the stream gets the
    ended-job marker's lifetime instead of staying for good."""
    stream = f"d:{uid}"
    producer = Producer(redis, service=service)
    await producer.add_stream(stream)
    await producer.append(stream, {"n": "0"})
    assert (await producer.cancel_stream(stream)).name == "REMOVED"
    assert 0 < await redis.pttl(stream) <= ENDED_MARKER_TTL_MS
    await producer.add_stream(stream)  # a new job: its stream must not expire
    assert await redis.pttl(stream) == -1


class _RejectsJobOne(Recorder):
    """Rejects entries of job 1 unless replayed; records (n, info job)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.jobs: list[tuple[str, str]] = []

    async def handle(self, message: Message) -> None:
        if message.fields.get("n") == "reject" and message.replayed_from is None:
            raise DeadLetter(reason="not yet")
        self.jobs.append((message.fields["n"], str(message.info.get("job"))))


async def test_a_replay_waits_while_a_later_job_of_the_name_runs(
    redis: AsyncRedis, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    stream = f"d:{uid}"
    producer = Producer(redis, service=service)
    letters = DeadLetters(redis, service=service)
    await producer.add_stream(stream, {"job": 1})
    await producer.append(stream, {"n": "reject"})
    await producer.close_stream(stream)
    c = consumer_factory(_RejectsJobOne, config=FAST)
    async with c:
        await eventually(lambda: true(len(c.jobs) == 0 and c.ended == [stream]))
        await producer.add_stream(stream, {"job": 2})
        await producer.append(stream, {"n": "a"})
        await eventually(lambda: true(c.jobs == [("a", "2")]))
        # Job 2 runs: the entry of job 1 would be handed to it as its own.
        report = await letters.replay(DeadLetterFilter(reason="not yet"))
        assert report.replayed == []
        [(_, why)] = report.skipped
        assert "later job" in why, why
        await producer.close_stream(stream)
        await eventually(lambda: true(c.ended == [stream, stream]))
        report = await letters.replay(DeadLetterFilter(reason="not yet"))
        assert len(report.replayed) == 1, report
        await eventually(lambda: true(len(c.ended) == 3))
    assert c.jobs == [("a", "2"), ("reject", "1")], "replayed as a job of its own, job 1's info"


async def test_entries_appended_after_a_normal_end_never_reach_the_next_job(
    redis: AsyncRedis, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    """Also after the end marker: a late append (a producer retrying, or one that
    closed too early) belongs to the job that ended, and add_stream skips it."""
    stream = f"d:{uid}"
    producer = Producer(redis, service=service)
    await producer.add_stream(stream)
    await producer.append(stream, {"n": "0"})
    await producer.close_stream(stream)
    c = consumer_factory(Recorder, config=FAST)
    async with c:
        await eventually(lambda: true(c.ended == [stream]))
        await producer.append(stream, {"n": "late"})
        await producer.close_stream(stream)
        await producer.add_stream(stream)
        await producer.append(stream, {"n": "job2"})
        await producer.close_stream(stream)
        await eventually(lambda: true(c.ended == [stream, stream]))
    assert _ns(c) == ["0", "job2"]


async def test_a_replayed_job_ends_and_later_appends_stay_with_it(
    redis: AsyncRedis, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    """A replay after an early end runs the dead entry as a job of its own; what the old
    producer appends after that job ended is not the next job's either."""
    stream = f"d:{uid}"
    producer = Producer(redis, service=service)
    await _job(producer, stream, ("reject", "stop"), {"job": 1})
    c = consumer_factory(_FinishesEarly, config=FAST)
    async with c:
        await eventually(lambda: true(c.ended == [stream]))
        report = await DeadLetters(redis, service=service).replay(
            DeadLetterFilter(reason="not yet")
        )
        assert len(report.replayed) == 1, report
        await eventually(lambda: true(len(c.ended) == 2))
        await producer.append(stream, {"n": "late"})  # job 1's producer goes on
        await producer.add_stream(stream, {"job": 2})
        await producer.append(stream, {"n": "job2"})
        await producer.close_stream(stream)
        await eventually(lambda: true(len(c.ended) == 3))
    assert _ns(c) == ["stop", "reject", "job2"]


@pytest.mark.parametrize("end", ["cancel", "finish", "close"])
async def test_a_stalled_owners_late_read_of_an_ended_jobs_tail_is_not_the_next_jobs(
    redis: AsyncRedis, service: str, uid: str, consumer_factory: ConsumerFactory, end: str
) -> None:
    """Found by the 30-minute soak: an owner stalled past its lock, woke after its job
    had ended elsewhere, and its fenced read ran: the fence failed, but the XREADGROUP
    queued behind it in the same transaction still delivered what the ended job's
    producer had appended since, to the stalled owner. The next job's owner claimed
    those pending entries first, as its own, and ended at the old job's end marker:
    its own entries were never handled."""
    stream = f"d:{uid}"
    producer = Producer(redis, service=service)
    ns = ["0", "stop", "1"] if end == "finish" else ["0"]
    await _job(producer, stream, ns, close=end == "close")
    c = consumer_factory(_FinishesEarly, config=FAST)
    async with c:
        if end == "cancel":
            await eventually(lambda: true(_ns(c) == ["0"]))
            await producer.cancel_stream(stream)
        keys = Keys(service)

        async def over() -> bool:  # sealed (the ended-job marker) and released
            return bool(await redis.exists(keys.ended(stream))) and not await redis.exists(
                keys.lock(stream)
            )

        await eventually(over)
        await producer.append(stream, {"n": "late"})  # the ended job's producer goes on
        await producer.close_stream(stream)
        # The stalled owner's read: its fence failed, its XREADGROUP did not.
        await redis.xreadgroup(service, "stalled", {stream: ">"})
        assert (await redis.xpending(stream, service))["pending"] == 2
        await _job(producer, stream, ["job2"], close=True)
        await eventually(lambda: true("job2" in _ns(c)))

        async def job2_over() -> bool:
            return not await redis.exists(keys.lock(stream))

        await eventually(job2_over)
    assert "late" not in _ns(c)
    assert _ns(c)[-1] == "job2"
    assert (await redis.xpending(stream, service))["pending"] == 0


async def test_a_previous_end_marker_of_the_same_millisecond_is_not_the_new_jobs(
    redis: AsyncRedis, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    """Ids of two streams are not ordered within one millisecond: the previous job's
    end marker can be ``T-1`` while the new job's assignment, written after it, is
    ``T-0``. A consumer that took the new job before its first entry was appended read
    that marker as the new job's own end and completed the job without its entries
    (CI met it under load). Set up with explicit ids, as the race leaves them."""
    import time

    from streamjobs._wire import EOS_FIELD, EOS_VALUE, build_fields

    stream = f"d:{uid}"
    keys = Keys(service)
    t = int(time.time() * 1000) - 1000
    await redis.xadd(stream, {"n": "late"}, id=f"{t}-0")
    await redis.xadd(stream, {EOS_FIELD: EOS_VALUE}, id=f"{t}-1")  # the previous end
    # What add_stream leaves: the group past everything there, and the job queued.
    await redis.xgroup_create(stream, service, id="$")
    await redis.xadd(keys.assignments, build_fields(stream, {"job": "2"}), id=f"{t}-0")
    c = consumer_factory(Recorder, config=FAST)
    async with c:
        await eventually(lambda: true(stream in c.owned_streams))
        producer = Producer(redis, service=service)
        await producer.append(stream, {"n": "job2"})
        await producer.close_stream(stream)
        await eventually(lambda: true(c.ended == [stream]))
    assert [h[3] for h in c.handled] == ["job2"]
