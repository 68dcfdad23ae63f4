"""Producer.cancel_stream against real Redis: a queued assignment is removed, an
owned stream is ended by its owner within one read batch (on_stream_cancelled, lock
released, nothing pending), and a new job of the same name is not cancelled."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import anyio
import pytest

from streamjobs import CancelOutcome, ConsumerConfig, Message, Producer
from streamjobs._keys import Keys
from tests.harness.plugin import ConsumerFactory

from ._helpers import Recorder, eventually, true

pytestmark = pytest.mark.anyio


class Cancellable(Recorder):
    cancelled: list[tuple[str, str]]
    gate: anyio.Event

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cancelled = []
        self.gate = anyio.Event()

    async def handle(self, message: Message) -> None:
        await super().handle(message)
        if message.fields.get("n") == "hold":
            await self.gate.wait()

    async def on_stream_cancelled(self, stream: str, reason: str) -> None:
        self.cancelled.append((stream, reason))

    async def on_stream_start(self, stream: str, info: Mapping[str, Any]) -> None:
        await super().on_stream_start(stream, info)


async def assert_nothing_left(redis: Any, service: str, stream: str) -> None:
    keys = Keys(service)
    assert await redis.xlen(keys.assignments) == 0
    if await redis.exists(keys.assignments):
        groups = await redis.xinfo_groups(keys.assignments)
        assert all(g["pending"] == 0 for g in groups)
    assert not await redis.exists(keys.lock(stream))
    assert not await redis.exists(keys.cancel(stream))
    assert await redis.hget(keys.active, stream) is None
    if await redis.exists(stream):
        groups = await redis.xinfo_groups(stream)
        assert all(g["pending"] == 0 for g in groups)


async def test_a_queued_assignment_is_removed(redis: Any, service: str, uid: str) -> None:
    producer = Producer(redis, service=service)
    stream = f"queued:{uid}"
    await producer.add_stream(stream)
    await producer.append(stream, {"n": "0"})
    assert await producer.cancel_stream(stream, reason="not needed") is CancelOutcome.REMOVED
    await assert_nothing_left(redis, service, stream)
    assert await producer.cancel_stream(stream) is CancelOutcome.NOT_FOUND
    assert await redis.xlen(stream) == 1  # the entries are left alone


async def test_an_owned_stream_ends_within_one_batch(
    redis: Any, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    producer = Producer(redis, service=service)
    stream = f"owned:{uid}"
    await producer.add_stream(stream)
    await producer.append(stream, {"n": "hold"})
    for i in range(500):  # a backlog the owner must not work through
        await producer.append(stream, {"n": str(i)})
    consumer = consumer_factory(Cancellable, config=ConsumerConfig(read_batch_size=10))
    async with consumer:

        async def holding() -> bool:
            return len(consumer.handled) == 1

        await eventually(holding)
        assert await producer.cancel_stream(stream, "user left") is CancelOutcome.SIGNALLED
        consumer.gate.set()  # the batch in hand goes on; the next read sees the marker

        async def cancelled() -> bool:
            return consumer.cancelled == [(stream, "user left")]

        await eventually(cancelled)
        assert len(consumer.handled) <= 10, "handled past the batch in hand"
        assert consumer.ended == []
        assert stream not in consumer.owned_streams
        await assert_nothing_left(redis, service, stream)

        # A new job of the same name runs normally: the marker and the unread backlog
        # of the cancelled one do not reach it.
        handled_before = len(consumer.handled)
        await producer.add_stream(stream)
        await producer.append(stream, {"n": "new"})
        await producer.close_stream(stream)

        async def new_job_done() -> bool:
            return consumer.ended == [stream]

        await eventually(new_job_done)
        assert [h[3] for h in consumer.handled[handled_before:]] == ["new"]
    await assert_nothing_left(redis, service, stream)


async def test_an_idle_owned_stream_is_woken_and_ended(
    redis: Any, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    producer = Producer(redis, service=service)
    stream = f"idle:{uid}"
    await producer.add_stream(stream)
    await producer.append(stream, {"n": "0"})
    consumer = consumer_factory(Cancellable, config=ConsumerConfig(read_block_ms=4000))
    async with consumer:

        async def waiting() -> bool:
            return len(consumer.handled) == 1

        await eventually(waiting)
        with anyio.fail_after(3):  # before the 4 s blocking read would end
            assert await producer.cancel_stream(stream) is CancelOutcome.SIGNALLED

            async def cancelled() -> bool:
                return consumer.cancelled == [(stream, "")]

            await eventually(cancelled)
    await assert_nothing_left(redis, service, stream)


class Slow(Cancellable):
    async def handle(self, message: Message) -> None:
        await super().handle(message)
        await anyio.sleep(0.05)  # slow on purpose: the batch is still being handled


async def test_a_batch_of_slow_entries_stops_at_the_next_lock_check(
    redis: Any, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    producer = Producer(redis, service=service)
    stream = f"slow:{uid}"
    await producer.add_stream(stream)
    for i in range(100):
        await producer.append(stream, {"n": str(i)})
    consumer = consumer_factory(Slow, config=ConsumerConfig(read_batch_size=100))
    async with consumer:

        async def begun() -> bool:
            return len(consumer.handled) >= 3

        await eventually(begun)
        assert await producer.cancel_stream(stream, "stop") is CancelOutcome.SIGNALLED
        seen = len(consumer.handled)

        async def cancelled() -> bool:
            return consumer.cancelled == [(stream, "stop")]

        await eventually(cancelled)
        # The owner re-reads its lock (and the cancel marker) at most every 50 ms, so it
        # stops within a few 50 ms entries, not at the end of the 100-entry batch.
        assert len(consumer.handled) <= seen + 5, (seen, len(consumer.handled))
        assert consumer.ended == []
    await assert_nothing_left(redis, service, stream)


async def test_a_cancel_after_the_end_marker_was_read_is_moot(
    redis: Any, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    producer = Producer(redis, service=service)
    stream = f"ending:{uid}"
    await producer.add_stream(stream)
    await producer.append(stream, {"n": "0"})
    await producer.append(stream, {"n": "hold"})
    await producer.close_stream(stream)
    consumer = consumer_factory(Cancellable)
    async with consumer:

        async def holding() -> bool:
            return len(consumer.handled) == 2

        await eventually(holding)
        # The batch in hand holds the end marker right after this entry.
        assert await producer.cancel_stream(stream, "late") is CancelOutcome.SIGNALLED
        consumer.gate.set()

        async def ended() -> bool:
            return consumer.ended == [stream]

        await eventually(ended)
        assert consumer.cancelled == []
    # The finish removed the marker the late cancel left.
    await assert_nothing_left(redis, service, stream)


async def test_a_cancel_with_the_default_reason_stops_a_busy_owner(
    redis: Any, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    """``cancel_stream(name)`` (what ``streamjobs cancel`` sends) writes an empty
    reason: it is a cancel all the same, not "not cancelled"."""
    producer = Producer(redis, service=service)
    stream = f"busy:{uid}"
    await producer.add_stream(stream)
    for i in range(200):
        await producer.append(stream, {"n": str(i)})
    consumer = consumer_factory(Slow, config=ConsumerConfig(read_batch_size=10))
    async with consumer:
        await eventually(lambda: true(len(consumer.handled) >= 3))
        assert await producer.cancel_stream(stream) is CancelOutcome.SIGNALLED
        seen = len(consumer.handled)
        await eventually(lambda: true(consumer.cancelled == [(stream, "")]))
        assert len(consumer.handled) <= seen + 5, (seen, len(consumer.handled))
    await assert_nothing_left(redis, service, stream)


async def test_cancelling_idle_owned_streams_leaves_no_marker(
    redis: Any, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    """The woken owner ends the stream and drops the marker: the marker must exist
    before the entry that wakes it (it was written after, and left behind 2 runs in 3)."""
    producer = Producer(redis, service=service)
    streams = [f"idle:{uid}:{i}" for i in range(8)]
    for s in streams:
        await producer.add_stream(s)
        await producer.append(s, {"n": "0"})
    consumer = consumer_factory(Cancellable, config=ConsumerConfig(read_block_ms=4000))
    async with consumer:
        await eventually(lambda: true(len(consumer.handled) == len(streams)))
        for s in streams:
            assert await producer.cancel_stream(s, "stop") is CancelOutcome.SIGNALLED
        await eventually(lambda: true(len(consumer.cancelled) == len(streams)))
    for s in streams:
        await assert_nothing_left(redis, service, s)


async def test_a_late_cancel_does_not_cancel_the_next_job_of_the_same_name(
    redis: Any, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    producer = Producer(redis, service=service)
    stream = f"reused:{uid}"
    await producer.add_stream(stream)
    await producer.append(stream, {"n": "0"})  # a first read takes one entry
    await producer.append(stream, {"n": "hold"})
    await producer.close_stream(stream)
    consumer = consumer_factory(Cancellable)
    async with consumer:
        await eventually(lambda: true(len(consumer.handled) == 2))
        # The owner holds the end marker in its batch: this cancel is moot, and must
        # leave nothing in the stream for the next job to read.
        assert await producer.cancel_stream(stream, "late") is CancelOutcome.SIGNALLED
        consumer.gate.set()
        await eventually(lambda: true(consumer.ended == [stream]))
        await producer.add_stream(stream)
        await producer.append(stream, {"n": "job2"})
        await producer.close_stream(stream)
        await eventually(lambda: true(consumer.ended == [stream, stream]))
    assert consumer.cancelled == []
    assert [h[3] for h in consumer.handled] == ["0", "hold", "job2"]
    await assert_nothing_left(redis, service, stream)


async def test_a_job_cancelled_before_it_was_read_leaves_nothing_for_the_next(
    redis: Any, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    """Found by the model test: cancelling a queued job removed its assignment but
    left its entries, which the next job of the same name then handled."""
    producer = Producer(redis, service=service)
    stream = f"queued:{uid}"
    await producer.add_stream(stream)
    await producer.append(stream, {"n": "old"})
    assert await producer.cancel_stream(stream) is CancelOutcome.REMOVED
    await producer.add_stream(stream)
    await producer.append(stream, {"n": "new"})
    await producer.close_stream(stream)
    consumer = consumer_factory(Cancellable)
    async with consumer:
        await eventually(lambda: true(consumer.ended == [stream]))
    assert [h[3] for h in consumer.handled] == ["new"]
    await assert_nothing_left(redis, service, stream)


async def test_an_idle_job_of_a_reused_name_is_woken_by_its_cancel(
    redis: Any, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    """Found by the long model run. The stream's newest entry was the previous job's
    end marker, so the cancel wrote only its marker: the new job's owner, waiting for
    entries, was woken by nothing and ended only at its idle re-read, minutes later.
    The end-with-cancel entry that wakes it must not reach the next job either."""
    producer = Producer(redis, service=service)
    stream = f"reused-idle:{uid}"
    await producer.add_stream(stream)
    await producer.append(stream, {"n": "job1"})
    await producer.close_stream(stream)
    consumer = consumer_factory(Cancellable, config=ConsumerConfig(read_block_ms=4000))
    async with consumer:
        await eventually(lambda: true(consumer.ended == [stream]))
        await producer.add_stream(stream)  # job 2: nothing appended yet
        await eventually(lambda: true(consumer.started == [stream, stream]))
        with anyio.fail_after(3):  # before the 4 s blocking read would end
            assert await producer.cancel_stream(stream) is CancelOutcome.SIGNALLED
            await eventually(lambda: true(consumer.cancelled == [(stream, "")]))
        await producer.add_stream(stream)  # job 3 starts after job 2's cancel
        await producer.append(stream, {"n": "job3"})
        await producer.close_stream(stream)
        await eventually(lambda: true(consumer.ended == [stream, stream]))
    assert consumer.cancelled == [(stream, "")]
    assert [h[3] for h in consumer.handled] == ["job1", "job3"]
    await assert_nothing_left(redis, service, stream)


PLACE_AND_SKIP = """
redis.call('XADD', KEYS[1], ARGV[1], '_eos', '1')
redis.call('XGROUP', 'SETID', KEYS[1], ARGV[2], ARGV[1])
return 1
"""


async def test_a_cancel_is_not_lost_when_the_previous_end_has_the_jobs_own_id(
    redis: Any, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    """Found by the long model run. The previous job's end marker and the new job's
    assignment, in two streams, got the same id (a job ended and the next was queued
    within one millisecond): the cancel took that marker for the new job's own end,
    already read, and wrote nothing, so the idle job kept its stream for good. The
    state is made here by placing that marker with the job's id, in one transaction
    with the group moved past it (as add_stream's skip does)."""
    producer = Producer(redis, service=service)
    keys = Keys(service)
    stream = f"same-ms:{uid}"
    await producer.add_stream(stream)
    await producer.close_stream(stream)
    consumer = consumer_factory(Cancellable, config=ConsumerConfig(read_block_ms=4000))
    async with consumer:
        await eventually(lambda: true(consumer.ended == [stream]))
        job = await producer.add_stream(stream)
        await eventually(lambda: true(consumer.started == [stream, stream]))
        top = (await redis.xrevrange(stream, count=1))[0][0].decode()
        if (int(top.split("-")[0]), int(top.split("-")[1])) >= tuple(map(int, job.split("-"))):
            pytest.skip("the end marker is not older than the job's id here")
        # One script: atomic on any client (redis-py 5.2's cluster pipeline has no
        # transactions), so the owner cannot read the marker in between.
        await redis.eval(PLACE_AND_SKIP, 1, stream, job, keys.group)
        with anyio.fail_after(3):  # before the 4 s blocking read would end
            assert await producer.cancel_stream(stream) is CancelOutcome.SIGNALLED
            await eventually(lambda: true(consumer.cancelled == [(stream, "")]))
    assert consumer.ended == [stream]
    await assert_nothing_left(redis, service, stream)
