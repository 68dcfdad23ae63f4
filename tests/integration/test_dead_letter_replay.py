"""DeadLetters against real Redis: replay round trips (a data entry of an open stream,
of a finished stream, a dead assignment), idempotency (twice, and after a crash
halfway), and purge by filter, through the API and the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
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
from streamjobs._operator import OperatorGateway
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
    # A replay that appended the entry and died before removing the dead letter.
    gw = OperatorGateway(redis, Keys(service))
    first, appended = await gw.replay_entry(
        stream, letter.id, list(letter.fields.items()), close=False, marker_ttl_ms=60_000
    )
    assert appended
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
