"""DeadLetters against real Redis: replay round trips (a data entry of an open stream,
of a finished stream, a dead assignment), idempotency (twice, and after a crash
halfway), and purge by filter, through the API and the CLI."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from redis.asyncio import Redis as AsyncRedis
from redis.asyncio.cluster import RedisCluster

from streamjobs import (
    ConsumerConfig,
    DeadLetterFilter,
    DeadLetterReason,
    DeadLetters,
    Inspector,
    Message,
    Producer,
    RecoveryConfig,
    StreamState,
)
from streamjobs._keys import Keys
from streamjobs._redis import Gateway
from streamjobs.dlq import _Queued
from tests.harness.plugin import ConsumerFactory

from ._helpers import Recorder, eventually

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]


class FailsOnce(Recorder):
    """Refuses entries with n=bad while ``refusing`` is set."""

    refusing = True

    async def handle(self, message: Message) -> None:
        if message.fields.get("n") == "bad" and self.refusing:
            raise ValueError("not today")
        await super().handle(message)


def config() -> ConsumerConfig:
    return ConsumerConfig(max_handler_attempts=1, read_block_ms=100)


async def assert_clean(redis: Any, service: str, *streams: str) -> None:
    keys = Keys(service)
    assert await redis.xlen(keys.assignments) == 0
    for stream in streams:
        assert not await redis.exists(keys.lock(stream))
        if await redis.exists(stream):
            assert all(g["pending"] == 0 for g in await redis.xinfo_groups(stream))


async def test_replay_of_an_open_streams_entry_round_trip(
    redis: Any, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    producer = Producer(redis, service=service)
    letters = DeadLetters(redis, service=service)
    stream = f"open:{uid}"
    await producer.add_stream(stream)
    await producer.append(stream, {"n": "bad"})
    consumer = consumer_factory(FailsOnce, config=config())
    async with consumer:

        async def dead() -> bool:
            return await letters.length() == 1

        await eventually(dead)
        [letter] = await letters.list()
        assert letter.reason is DeadLetterReason.HANDLER_FAILED
        consumer.refusing = False
        report = await letters.replay([letter.id])
        assert [r.target for r in report.replayed] == [stream]
        assert not report.replayed[0].reassigned

        async def handled() -> bool:
            return [h[3] for h in consumer.handled] == ["bad"]

        await eventually(handled)
        assert await letters.length() == 0
        again = await letters.replay([letter.id])  # idempotent: nothing left to replay
        assert again.replayed == []
        assert len(again.skipped) == 1
        await producer.close_stream(stream)

        async def ended() -> bool:
            return consumer.ended == [stream]

        await eventually(ended)
    assert [h[3] for h in consumer.handled] == ["bad"], "handled once"
    await assert_clean(redis, service, stream)


async def test_replay_of_a_finished_streams_entry_reassigns_it(
    redis: Any, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    producer = Producer(redis, service=service)
    letters = DeadLetters(redis, service=service)
    stream = f"done:{uid}"
    await producer.add_stream(stream)
    await producer.append(stream, {"n": "bad"})
    await producer.close_stream(stream)
    consumer = consumer_factory(FailsOnce, config=config())
    async with consumer:

        async def finished() -> bool:
            return consumer.ended == [stream] and await letters.length() == 1

        await eventually(finished)
        status = await Inspector(redis, service=service).stream_status(stream)
        assert status.state is StreamState.FINISHED, status
        consumer.refusing = False
        report = await letters.replay(DeadLetterFilter(source_stream=stream))
        assert [r.reassigned for r in report.replayed] == [True]

        async def handled_and_ended_again() -> bool:
            return consumer.ended == [stream, stream] and len(consumer.handled) == 1

        await eventually(handled_and_ended_again)
    assert await letters.length() == 0
    await assert_clean(redis, service, stream)


async def test_a_replay_interrupted_halfway_appends_once(
    redis: Any, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    producer = Producer(redis, service=service)
    letters = DeadLetters(redis, service=service)
    stream = f"crash:{uid}"
    await producer.add_stream(stream)
    await producer.append(stream, {"n": "bad"})
    consumer = consumer_factory(FailsOnce, config=config())
    async with consumer:

        async def dead() -> bool:
            return await letters.length() == 1

        await eventually(dead)
    [letter] = await letters.list()
    # A replay that queued its run, appended the entry and died before removing the
    # dead letter.
    await letters._queue_run(stream, [letter], letter.job)
    gw = Gateway(redis, Keys(service))
    put = await gw.operator.replay_entries(
        stream, [(letter.id, list(letter.fields.items()))], run=True, marker_ttl_ms=60_000
    )
    assert put.state == "placed"
    [first] = put.ids
    report = await letters.replay([letter.id])
    assert [r.new_id for r in report.replayed] == [first]
    assert await letters.length() == 0
    bad = [e for e in await redis.xrange(stream) if e[1].get(b"n") == b"bad"]
    assert len(bad) == 2, "the original and one replayed copy, not two"


async def test_replay_of_a_dead_assignment_resets_its_retries(
    redis: Any, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    keys = Keys(service)
    letters = DeadLetters(redis, service=service)
    producer = Producer(redis, service=service)
    stream = f"poison:{uid}"
    await producer.add_stream(stream)
    await producer.append(stream, {"n": "0"})
    await producer.close_stream(stream)
    await redis.xgroup_create(keys.assignments, service, id="0", mkstream=True)
    # Its owners died too often: recovery dead-letters it (max_retries=0).
    [[_, [(assignment_id, _)]]] = await redis.xreadgroup(
        service, "dead", {keys.assignments: ">"}, count=1
    )
    consumer = consumer_factory(
        Recorder,
        config=config(),
        recovery=RecoveryConfig(min_idle_s=15, max_retries=0, interval_s=3600),
    )
    async with consumer:
        await consumer.claim(assignment_id.decode())
    [letter] = await letters.list(reason="max_retries_exceeded")
    assert letter.retry_count == 1
    dry = await letters.replay([letter.id], dry_run=True)
    assert [r.new_id for r in dry.replayed] == [""]
    assert await letters.length() == 1
    report = await letters.replay([letter.id])
    [replayed] = report.replayed
    [(_, fields)] = await redis.xrange(keys.assignments, replayed.new_id, replayed.new_id)
    assert fields[b"stream"] == stream.encode()
    assert b"_retry_count" not in fields
    assert b"_lost_at" not in fields
    assert await redis.hget(keys.active, stream) == replayed.new_id.encode()
    second = consumer_factory(Recorder, config=config())
    async with second:

        async def ended() -> bool:
            return second.ended == [stream]

        await eventually(ended)
    assert await letters.length() == 0
    await assert_clean(redis, service, stream)


async def cli(client: Any, request: pytest.FixtureRequest, *args: str) -> Any:
    if isinstance(client, RedisCluster):
        url, flags = request.getfixturevalue("redis_cluster").url, ["--cluster"]
    else:
        url, flags = request.getfixturevalue("redis_url"), []

    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "streamjobs", *args, *flags],
            cwd=ROOT,
            env={**os.environ, "STREAMJOBS_REDIS_URL": url, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
            timeout=120,
        )

    return await anyio.to_thread.run_sync(run)


async def test_purge_by_filter_through_the_cli(
    request: pytest.FixtureRequest, redis: Any, service: str, uid: str
) -> None:
    keys = Keys(service)
    await redis.xgroup_create(keys.assignments, service, id="0", mkstream=True)
    pipe = redis.pipeline(transaction=False)
    for i in range(250):  # enough for a progress bar
        pipe.xadd(
            keys.dead_letters,
            {"n": str(i), "_dlq_reason": "handler_failed", "_source_stream": f"s:{uid}",
             "_source_id": f"{i + 1}-0", "_attempts": "3", "_retry_count": "0"},
        )  # fmt: skip
    for i in range(3):
        pipe.xadd(
            keys.dead_letters,
            {"stream": f"x:{uid}:{i}", "_dlq_reason": "unparseable",
             "_source_stream": keys.assignments, "_source_id": f"{i + 1}-0"},
        )  # fmt: skip
    await pipe.execute()
    letters = DeadLetters(redis, service=service)

    dry = await cli(
        redis, request, "dlq", "purge", "--service", service, "--reason", "handler_failed",
        "--dry-run", "--json",
    )  # fmt: skip
    assert dry.returncode == 0, dry.stderr
    assert len(json.loads(dry.stdout)["purged"]) == 250
    assert await letters.length() == 253

    refused = await cli(redis, request, "dlq", "purge", "--service", service)
    assert refused.returncode == 2
    assert "--all" in refused.stderr

    done = await cli(
        redis, request, "dlq", "purge", "--service", service, "--reason", "handler_failed"
    )
    assert done.returncode == 0, done.stderr
    assert "purged: 250" in done.stdout
    assert "purging" in done.stderr, "a progress bar for 250 dead letters"
    left = await letters.list()
    assert [r.reason for r in left] == [DeadLetterReason.UNPARSEABLE] * 3


# -- several dead letters of one stream (docs/operations.md#dead-letters) ---------------


class RefusesBad(Recorder):
    """Refuses every entry whose n starts with 'bad' while ``refusing`` is set."""

    refusing = True

    async def handle(self, message: Message) -> None:
        if self.refusing and message.fields.get("n", "").startswith("bad"):
            raise ValueError("not today")
        await super().handle(message)


async def contents(redis: AsyncRedis, stream: str) -> list[dict[Any, Any]]:
    """The fields of every entry of ``stream``, without the ``_replayed_from`` a replay
    adds to its copies (tests/integration/test_replay_origin.py checks that one) and the
    ``_replay_end`` it adds to its run's end marker (checked below)."""
    return [
        {k: v for k, v in f.items() if k not in (b"_replayed_from", b"_replay_end")}
        for _, f in await redis.xrange(stream)
    ]


def retained(ttl_s: float | None) -> ConsumerConfig:
    return ConsumerConfig(max_handler_attempts=1, read_block_ms=100, finished_stream_ttl_s=ttl_s)


async def finished_with_dead_letters(
    redis: Any, service: str, stream: str, count: int, factory: ConsumerFactory, ttl_s: float | None
) -> list[str]:
    """Run ``stream`` (ok, bad0, ..., bad<count-1>, end) to its end with a consumer that
    dead-letters every bad entry; returns the dead letters' ids, oldest first."""
    producer = Producer(redis, service=service)
    letters = DeadLetters(redis, service=service)
    await producer.add_stream(stream)
    await producer.append(stream, {"n": "ok"})
    for i in range(count):
        await producer.append(stream, {"n": f"bad{i}"})
    await producer.close_stream(stream)
    first = factory(RefusesBad, config=retained(ttl_s))
    async with first:

        async def finished() -> bool:
            return first.ended == [stream] and await letters.length() == count

        await eventually(finished)
    assert [h[3] for h in first.handled] == ["ok"]
    records = await letters.list(source_stream=stream)
    assert [r.fields["n"] for r in records] == [f"bad{i}" for i in range(count)]
    return [r.id for r in records]


async def assert_finished(redis: Any, service: str, stream: str, ttl_s: float | None) -> None:
    """Everything handled and acked, no assignment, no dead letter left."""
    keys = Keys(service)
    await assert_clean(redis, service, stream)
    assert not await redis.hexists(keys.active, stream)
    assert await DeadLetters(redis, service=service).length() == 0
    if ttl_s == 0:
        assert not await redis.exists(stream), "deleted at the end of its (last) job"
    else:
        status = await Inspector(redis, service=service).stream_status(stream)
        assert status.state is StreamState.FINISHED, status


async def run_to_the_end(
    factory: ConsumerFactory, stream: str, expected: list[str], ttl_s: float | None
) -> Recorder:
    consumer = factory(Recorder, config=retained(ttl_s))
    async with consumer:

        async def done() -> bool:
            return [h[3] for h in consumer.handled] == expected and bool(consumer.ended)

        await eventually(done)
        await anyio.sleep(0.3)  # a window in which nothing more may come (each entry once)
    assert [h[3] for h in consumer.handled] == expected, "each once, in dead-letter order"
    return consumer


@pytest.mark.parametrize("ttl_s", [0, None])
@pytest.mark.parametrize("count", [2, 3])
async def test_several_dead_letters_of_a_finished_stream_in_one_call(
    redis: Any, service: str, uid: str, consumer_factory: ConsumerFactory, count: int,
    ttl_s: float | None,
) -> None:  # fmt: skip
    stream = f"several:{uid}"
    ids = await finished_with_dead_letters(redis, service, stream, count, consumer_factory, ttl_s)
    letters = DeadLetters(redis, service=service)
    dry = await letters.replay(DeadLetterFilter(source_stream=stream), dry_run=True)
    assert [(r.dead_letter_id, r.reassigned) for r in dry.replayed] == [(i, True) for i in ids]
    report = await letters.replay(DeadLetterFilter(source_stream=stream))
    assert report.skipped == []
    assert [r.dead_letter_id for r in report.replayed] == ids
    assert all(r.reassigned and r.target == stream for r in report.replayed)
    entries = await redis.xrange(stream)
    tail = [(f.get(b"n"), f.get(b"_eos")) for _, f in entries[-(count + 1) :]]
    assert tail == [*((f"bad{i}".encode(), None) for i in range(count)), (None, b"1")]
    assert [r.new_id.encode() for r in report.replayed] == [
        e[0] for e in entries[-(count + 1) : -1]
    ]
    assert await redis.xlen(Keys(service).assignments) == 1, "one new job for all of them"
    again = await letters.replay(ids)
    assert again.replayed == []
    assert len(again.skipped) == count
    consumer = await run_to_the_end(
        consumer_factory, stream, [f"bad{i}" for i in range(count)], ttl_s
    )
    assert consumer.ended == [stream], "one job"
    await assert_finished(redis, service, stream, ttl_s)
    # A retry of the batch (as after a crash before its dead letters were removed)
    # finds them read and appends nothing.
    length = await redis.xlen(stream)
    late = await Gateway(redis, Keys(service)).operator.replay_entries(
        stream, [(i, [("n", "x")]) for i in ids], run=True, marker_ttl_ms=60_000
    )
    assert late.state == "delivered"
    assert late.ids == [r.new_id for r in report.replayed]
    assert await redis.xlen(stream) == length


@pytest.mark.parametrize("ttl_s", [0, None])
@pytest.mark.parametrize("count", [2, 3])
async def test_dead_letters_of_a_finished_stream_replayed_one_call_each(
    redis: Any, service: str, uid: str, consumer_factory: ConsumerFactory, count: int,
    ttl_s: float | None,
) -> None:  # fmt: skip
    stream = f"separate:{uid}"
    ids = await finished_with_dead_letters(redis, service, stream, count, consumer_factory, ttl_s)
    letters = DeadLetters(redis, service=service)
    reports = [await letters.replay([i]) for i in ids]
    assert [len(r.replayed) for r in reports] == [1] * count
    # The first starts a new job; the next ones join it, before its end marker.
    assert [r.replayed[0].reassigned for r in reports] == [True] + [False] * (count - 1)
    fields = await contents(redis, stream)
    assert [f.get(b"n") for f in fields[-(count + 1) : -1]] == [
        f"bad{i}".encode() for i in range(count)
    ]
    assert fields[-1] == {b"_eos": b"1"}
    assert sum(1 for f in fields if b"_eos" in f) == (2 if ttl_s is None else 1)
    assert await redis.xlen(Keys(service).assignments) == 1
    consumer = await run_to_the_end(
        consumer_factory, stream, [f"bad{i}" for i in range(count)], ttl_s
    )
    assert consumer.ended == [stream], "one job"
    await assert_finished(redis, service, stream, ttl_s)


@pytest.mark.parametrize("pause_s", [0.0, 0.05, 0.2, "handled"])
@pytest.mark.parametrize("ttl_s", [0, None])
async def test_separate_replays_while_a_consumer_runs(
    redis: Any, service: str, uid: str, consumer_factory: ConsumerFactory,
    ttl_s: float | None, pause_s: float | str,
) -> None:  # fmt: skip
    stream = f"running:{uid}"
    count = 3
    ids = await finished_with_dead_letters(redis, service, stream, count, consumer_factory, ttl_s)
    letters = DeadLetters(redis, service=service)
    consumer = consumer_factory(Recorder, config=retained(ttl_s))
    expected = [f"bad{i}" for i in range(count)]
    async with consumer:
        for n, dead_letter_id in enumerate(ids):
            report = await letters.replay([dead_letter_id])
            assert [r.dead_letter_id for r in report.replayed] == [dead_letter_id], report
            if pause_s == "handled":  # the job it started (or joined) may be ending now

                async def handled(n: int = n) -> bool:
                    return len(consumer.handled) == n + 1

                await eventually(handled)
            else:
                assert isinstance(pause_s, float)
                await anyio.sleep(pause_s)  # the pause between replays under test

        async def done() -> bool:
            return [h[3] for h in consumer.handled] == expected and (
                not await redis.exists(Keys(service).lock(stream))
                and await redis.xlen(Keys(service).assignments) == 0
            )

        await eventually(done)
        await anyio.sleep(0.3)  # a window in which nothing more may come (each entry once)
    assert [h[3] for h in consumer.handled] == expected, "each once, in dead-letter order"
    assert consumer.ended
    assert set(consumer.ended) == {stream}
    await assert_finished(redis, service, stream, ttl_s)


@pytest.mark.parametrize("batch", [1, 10])
async def test_a_replay_into_a_running_stream_closed_by_its_producer(
    redis: Any, service: str, uid: str, consumer_factory: ConsumerFactory, batch: int
) -> None:
    """The producer's end marker is written and the owner is busy before it. Not read
    yet (batches of 1): the entry goes before it, the same job hands it over. Read
    with the batch: the replay waits for that job to end, then starts a new one."""
    producer = Producer(redis, service=service)
    letters = DeadLetters(redis, service=service)
    stream = f"closing:{uid}"
    release = anyio.Event()

    class Slow(RefusesBad):
        async def handle(self, message: Message) -> None:
            if message.fields.get("n") == "slow":
                await release.wait()
            await super().handle(message)

    await producer.add_stream(stream)
    await producer.append(stream, {"n": "bad"})
    await producer.append(stream, {"n": "slow"})
    await producer.close_stream(stream)
    config = dataclasses.replace(retained(None), read_batch_size=batch)
    consumer = consumer_factory(Slow, config=config)
    async with consumer:

        async def dead() -> bool:
            return await letters.length() == 1

        await eventually(dead)
        consumer.refusing = False
        async with anyio.create_task_group() as tg:
            if batch > 1:
                tg.start_soon(later, 0.5, release.set)
            report = await letters.replay(DeadLetterFilter(source_stream=stream))
        assert [r.reassigned for r in report.replayed] == [batch > 1]
        fields = await contents(redis, stream)
        assert fields[-2:] == [{b"n": b"bad"}, {b"_eos": b"1"}]
        assert sum(1 for f in fields if b"_eos" in f) == (1 if batch == 1 else 2)
        release.set()

        async def ended() -> bool:
            return consumer.ended == [stream] * (1 if batch == 1 else 2)

        await eventually(ended)
    assert [h[3] for h in consumer.handled] == ["slow", "bad"]
    await assert_finished(redis, service, stream, None)


async def later(delay_s: float, action: Callable[[], Any]) -> None:
    """``action()`` after ``delay_s``: the job ends while the replay waits for it (the
    delay is the point, nothing in Redis shows that the replay is waiting)."""
    await anyio.sleep(delay_s)
    action()


@pytest.mark.parametrize("why", ["lock", "pending"])
async def test_a_replay_waits_for_a_job_past_its_end_marker(
    redis: Any, service: str, uid: str, consumer_factory: ConsumerFactory,
    monkeypatch: pytest.MonkeyPatch, why: str,
) -> None:  # fmt: skip
    """The job that read the stream's end marker has not finished (its owner holds the
    lock, or it is still pending: the owner died and recovery will complete it): an
    entry appended now would come after that job's end. The replay waits, then skips
    it with its dead letter kept, and the run it queued meanwhile is gone again."""
    import streamjobs.dlq

    keys = Keys(service)
    stream = f"ending:{uid}"
    [dead_letter_id] = await finished_with_dead_letters(
        redis, service, stream, 1, consumer_factory, None
    )
    [(marker, _)] = await redis.xrevrange(stream, count=1)
    if why == "lock":
        await redis.set(keys.lock(stream), "gone:0123456789abcdef")
    else:  # as if the owner had read the marker and died before sealing (and its
        # assignment was dead-lettered since): no ended-job marker, the marker pending
        await redis.delete(keys.ended(stream))
        await redis.xgroup_setid(stream, service, "0")
        await redis.xreadgroup(service, "ghost", {stream: ">"})
        await redis.xack(stream, service, *[e for e, _ in await redis.xrange(stream)][:-1])
    length = await redis.xlen(stream)
    letters = DeadLetters(redis, service=service)
    monkeypatch.setattr(streamjobs.dlq, "BUSY_WAIT_S", 0.3)
    report = await letters.replay([dead_letter_id])
    assert report.replayed == []
    [(skipped, why_skipped)] = report.skipped
    assert skipped == dead_letter_id
    assert "ending" in why_skipped
    assert await letters.length() == 1, "kept"
    assert await redis.xlen(stream) == length, "nothing written"
    assert await redis.xlen(keys.assignments) == 0

    async def that_job_finishes() -> None:
        # The job ends while the replay waits for it (up to BUSY_WAIT_S, 10 s now): the
        # delay is the point, nothing in Redis shows that the replay is waiting.
        await anyio.sleep(0.5)
        if why == "lock":
            await redis.delete(keys.lock(stream))
        else:
            await redis.xack(stream, service, marker)

    monkeypatch.setattr(streamjobs.dlq, "BUSY_WAIT_S", 10.0)
    async with anyio.create_task_group() as tg:
        tg.start_soon(that_job_finishes)
        report = await letters.replay([dead_letter_id])
    assert [r.reassigned for r in report.replayed] == [True], report
    fields = await contents(redis, stream)
    assert fields[-2:] == [{b"n": b"bad0"}, {b"_eos": b"1"}], "after that job's end"
    await run_to_the_end(consumer_factory, stream, ["bad0"], None)
    await assert_finished(redis, service, stream, None)


async def test_a_queued_job_that_finishes_before_the_append_is_noticed(
    redis: Any, service: str, uid: str, consumer_factory: ConsumerFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """The replay saw a job queued, which finished before its script ran: the script
    finds that job's end recorded and writes nothing, the replay looks again, queues a
    run for the entries, then places them with their end marker."""
    stream = f"stale:{uid}"
    ids = await finished_with_dead_letters(redis, service, stream, 2, consumer_factory, 0)
    letters = DeadLetters(redis, service=service)
    looks: list[bool] = []
    real = letters._queued_job
    record = await letters.get(ids[0])
    assert record is not None
    assert record.job, "a dead letter names its job"

    async def stale(name: str) -> _Queued | None:
        found = await real(name)
        looks.append(found is not None)
        # The first look still saw the job (the one the entries came from).
        return _Queued(record.job, run=False) if len(looks) == 1 else found

    monkeypatch.setattr(letters, "_queued_job", stale)
    report = await letters.replay(ids)
    assert looks == [False, False], "looked, refused, looked again"
    assert [r.reassigned for r in report.replayed] == [True, True]
    fields = await contents(redis, stream)
    assert fields == [{b"n": b"bad0"}, {b"n": b"bad1"}, {b"_eos": b"1"}]
    await run_to_the_end(consumer_factory, stream, ["bad0", "bad1"], 0)
    await assert_finished(redis, service, stream, 0)


async def test_a_job_queued_while_a_replay_runs_reads_only_its_own_entries(
    redis: Any, service: str, uid: str, consumer_factory: ConsumerFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """``add_stream`` of the name lands while a replay of a finished job's dead entry
    runs: after the replay found no job queued, before it queued its run. The run is
    queued before the entry is placed, so the replay sees the new job, is refused for
    the stream (the dead letter kept), and the new job reads only its own entries. Once
    that job has ended, the replay puts the entry back in a run of its own job."""
    stream = f"race:{uid}"
    [dead] = await finished_with_dead_letters(redis, service, stream, 1, consumer_factory, None)
    letters = DeadLetters(redis, service=service)
    producer = Producer(redis, service=service)
    gw = letters._gw
    real = gw.writes.add_assignment
    raced: list[str] = []

    async def racing(name: str, fields: Any, **kwargs: Any) -> tuple[str, bool]:
        if "_job" in fields and not raced:  # the replay queues its run
            raced.append(await producer.add_stream(stream, {"job": 2}))
        return await real(name, fields, **kwargs)

    monkeypatch.setattr(gw.writes, "add_assignment", racing)
    report = await letters.replay([dead])
    assert raced, "add_stream ran inside the replay"
    assert report.replayed == []
    [(skipped, why)] = report.skipped
    assert skipped == dead
    assert "later job" in why
    assert await letters.length() == 1, "kept"
    await producer.append(stream, {"n": "new0"})
    await producer.close_stream(stream)
    second = await run_to_the_end(consumer_factory, stream, ["new0"], None)
    assert second.ended == [stream], "one job, ended at its own end marker"
    report = await letters.replay([dead])
    assert [r.reassigned for r in report.replayed] == [True], report
    await run_to_the_end(consumer_factory, stream, ["bad0"], None)
    await assert_finished(redis, service, stream, None)


async def test_a_run_hands_over_only_its_replayed_entries(
    redis: Any, service: str, uid: str, consumer_factory: ConsumerFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """Found by the 30-minute soak: job 2 of the name had ended, and its producer (not
    knowing) appended more, and an end marker, between the replay's queueing of job 1's
    run and the placement of job 1's entry. Those belong to job 2: the run skips them
    (acked, never handled), hands over its replayed copy, and ends at its own marker."""
    stream = f"late:{uid}"
    [dead] = await finished_with_dead_letters(redis, service, stream, 1, consumer_factory, None)
    producer = Producer(redis, service=service)
    await producer.add_stream(stream, {"job": 2})
    await producer.append(stream, {"n": "job2"})
    await producer.close_stream(stream)
    await run_to_the_end(consumer_factory, stream, ["job2"], None)
    letters = DeadLetters(redis, service=service)
    gw = letters._gw
    real = gw.writes.start_job

    async def then_job2_appends(name: str, job: str, *, created: bool) -> bool:
        skipped = await real(name, job, created=created)
        if created:  # the run is queued; its entries are not placed yet
            await producer.append(stream, {"n": "late"})
            await producer.close_stream(stream)
        return skipped

    monkeypatch.setattr(gw.writes, "start_job", then_job2_appends)
    report = await letters.replay([dead])
    assert [r.reassigned for r in report.replayed] == [True], report
    [(_, end)] = await redis.xrevrange(stream, count=1)
    assert end == {b"_eos": b"1", b"_replay_end": b"1"}, "the run's own end marker"
    run = await run_to_the_end(consumer_factory, stream, ["bad0"], None)
    assert run.ended == [stream]
    await assert_finished(redis, service, stream, None)


async def test_a_replay_that_gives_up_ends_the_run_an_owner_already_took(
    redis: Any, service: str, uid: str, consumer_factory: ConsumerFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """The replay queued a run for a finished job's dead entry and a consumer took it,
    but the entry could not be placed before the replay gave up (here the script
    answers busy throughout). The run is not left waiting for an entry that will not
    come: the replay ends it with the run's own end marker, its owner finishes it
    with nothing handed to ``handle()``, and the dead letter is kept."""
    import streamjobs.dlq
    from streamjobs._redis._operator import EntryReplay

    keys = Keys(service)
    stream = f"gave-up:{uid}"
    [dead_letter_id] = await finished_with_dead_letters(
        redis, service, stream, 1, consumer_factory, None
    )
    letters = DeadLetters(redis, service=service)
    attempts: list[str] = []

    async def busy_once_the_run_is_owned(*_: Any, **__: Any) -> EntryReplay:
        # The run's owner holds the lock before the replay gives up: cancel_queued
        # then finds the run delivered, not queued.
        async def owned() -> bool:
            return bool(await redis.exists(keys.lock(stream)))

        await eventually(owned)
        attempts.append("busy")
        return EntryReplay(state="busy", closed=False, owned=True, ids=[])

    monkeypatch.setattr(letters._gw.operator, "replay_entries", busy_once_the_run_is_owned)
    monkeypatch.setattr(streamjobs.dlq, "BUSY_WAIT_S", 0.5)
    consumer = consumer_factory(Recorder, config=retained(None))
    async with consumer:
        report = await letters.replay([dead_letter_id])

        async def run_ended() -> bool:
            return consumer.ended == [stream] and not await redis.exists(keys.lock(stream))

        await eventually(run_ended)
    assert attempts, "the placement was tried"
    assert report.replayed == []
    [(skipped, why)] = report.skipped
    assert skipped == dead_letter_id
    assert "ending" in why
    assert consumer.handled == [], "the run had nothing of its own"
    await assert_clean(redis, service, stream)
    assert not await redis.hexists(keys.active, stream)
    assert await letters.length() == 1, "kept, for a later replay"
    [(_, last)] = await redis.xrevrange(stream, count=1)
    assert last.get(b"_replay_end") == b"1", "ended at the run's own marker"
