"""The operator commands as an operator runs them (``python -m streamjobs ...`` in a
subprocess), on a live scenario: a running consumer that owns a stream, a dead
consumer whose assignment waits for recovery, a queued assignment and two dead
letters. Standalone and on the 3 + 3 cluster."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from redis.asyncio.cluster import RedisCluster

from streamjobs import (
    ConsumerConfig,
    DeadLetter,
    DeadLetters,
    Inspector,
    Message,
    Producer,
    RecoveryConfig,
    StreamState,
)
from streamjobs._keys import Keys
from tests.harness.plugin import ConsumerFactory

from ._helpers import Recorder, eventually

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]


def url_of(request: pytest.FixtureRequest, client: Any) -> tuple[str, list[str]]:
    if isinstance(client, RedisCluster):
        return request.getfixturevalue("redis_cluster").url, ["--cluster"]
    return request.getfixturevalue("redis_url"), []


async def cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "streamjobs", *args],
            cwd=ROOT,
            env={**os.environ, "STREAMJOBS_REDIS_URL": url, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
            timeout=60,
        )

    return await anyio.to_thread.run_sync(run)


class Picky(Recorder):
    async def handle(self, message: Message) -> None:
        await super().handle(message)
        if message.fields.get("n") == "bad":
            raise DeadLetter("refused by the test")


async def scenario(
    redis: Any, service: str, uid: str, consumer_factory: ConsumerFactory
) -> tuple[Picky, dict[str, str]]:
    """A live consumer owning ``owned``; ``orphan`` delivered to a dead consumer; two
    dead letters (a data entry, an assignment); ``queued`` not delivered yet."""
    keys = Keys(service)
    producer = Producer(redis, service=service)
    names = {n: f"{n}:{uid}" for n in ("owned", "orphan", "queued", "poison")}
    await redis.xgroup_create(keys.assignments, service, id="0", mkstream=True)
    await producer.add_stream(names["orphan"])
    await redis.xreadgroup(service, "dead-consumer", {keys.assignments: ">"}, count=1)
    # An assignment that exhausted its retries: dead-lettered by recovery below.
    await redis.xadd(keys.assignments, {"stream": names["poison"], "_retry_count": "9"})
    await redis.xreadgroup(service, "dead-consumer", {keys.assignments: ">"}, count=1)
    await producer.add_stream(names["owned"])
    await producer.append(names["owned"], {"n": "0"})
    await producer.append(names["owned"], {"n": "bad"})
    consumer = consumer_factory(
        Picky,
        config=ConsumerConfig(max_concurrent_streams=1, max_handler_attempts=1),
        # No recovery during the test, but the scan runs once at start: it dead-letters
        # the poison assignment (idle past min_idle_s) and leaves the orphan alone.
        recovery=RecoveryConfig(min_idle_s=15, max_retries=3, interval_s=3600),
    )
    return consumer, names


async def test_status_dlq_and_prune_on_a_live_scenario(
    request: pytest.FixtureRequest,
    redis: Any,
    service: str,
    uid: str,
    consumer_factory: ConsumerFactory,
) -> None:
    url, flags = url_of(request, redis)
    consumer, names = await scenario(redis, service, uid, consumer_factory)
    letters = DeadLetters(redis, service=service)
    async with consumer:

        async def settled() -> bool:
            return names["owned"] in consumer.owned_streams and await letters.length() == 1

        await eventually(settled)
        # The poison assignment: idle time is not yet past min_idle_s; claim it now.
        poison_id = (await redis.xrange(Keys(service).assignments))[1][0].decode()
        await consumer.claim(poison_id)
        await producer_add(redis, service, names["queued"])

        done = await cli(url, "status", "--service", service, "--json", *flags)
        assert done.returncode == 0, done.stderr
        view = json.loads(done.stdout)
        assert list(view) == ["service", "consumers", "streams", "pending", "dlq", "groups"]
        assert view["groups"] == []
        assert view["service"]["name"] == service
        assert view["service"]["queued"] == 1
        assert view["service"]["oldest_pending_age_s"] >= 0
        by_name = {c["name"]: c for c in view["consumers"]}
        assert by_name[consumer.consumer_name]["alive"] is True
        assert by_name[consumer.consumer_name]["owned_streams"] == 1
        assert by_name["dead-consumer"]["alive"] is False
        [owned] = view["streams"]
        assert owned["stream"] == names["owned"]
        assert owned["owner"] == consumer.consumer_name
        # The default liveness is SESSION: a lock's own TTL is the long session lock TTL.
        assert 0 < owned["lock_ttl_s"] <= ConsumerConfig().session_lock_ttl_ms / 1000
        assert owned["pending"] == 0
        assert owned["lag"] == 0
        [orphan] = view["pending"]
        assert (orphan["stream"], orphan["consumer"]) == (names["orphan"], "dead-consumer")
        assert view["dlq"]["length"] == 2
        assert view["dlq"]["by_reason"] == {"max_retries_exceeded": 1, "rejected": 1}

        human = await cli(url, "status", "--service", service, *flags)
        assert human.returncode == 0, human.stderr
        print(human.stdout)  # the closing note quotes it
        assert "dead-consumer" in human.stdout
        assert names["owned"] in human.stdout

        listed = await cli(url, "dlq", "list", "--service", service, "--json", *flags)
        assert listed.returncode == 0, listed.stderr
        records = json.loads(listed.stdout)
        assert sorted(r["reason"] for r in records) == ["max_retries_exceeded", "rejected"]
        entry = next(r for r in records if r["kind"] == "entry")
        assert entry["fields"] == {"n": "bad"}
        assert entry["source_stream"] == names["owned"]

        only = await cli(
            url, "dlq", "list", "--service", service, "--reason", "rejected", "--json",
            *flags,
        )  # fmt: skip
        assert [r["id"] for r in json.loads(only.stdout)] == [entry["id"]]

        # Any other text is a handler's DeadLetter reason: none matches "nope".
        nope = await cli(url, "dlq", "list", "--service", service, "--reason", "nope", *flags)
        assert nope.returncode == 0, nope.stderr
        assert "0 dead letter(s)" in nope.stdout
        refused = await cli(
            url, "dlq", "list", "--service", service, "--reason", "refused by the test",
            "--json", *flags,
        )  # fmt: skip
        assert [r["id"] for r in json.loads(refused.stdout)] == [entry["id"]]
        bad = await cli(url, "dlq", "list", "--service", service, "--reason", "", *flags)
        assert bad.returncode == 2
        assert bad.stderr.strip().splitlines() == [bad.stderr.strip()], "one line, no traceback"
        assert "reason" in bad.stderr

        stream_status = await Inspector(redis, service=service).stream_status(names["owned"])
        assert stream_status.state is StreamState.OWNED
        assert stream_status.owner == consumer.consumer_name
        queued = await Inspector(redis, service=service).stream_status(names["queued"])
        assert queued.state is StreamState.QUEUED
        dead = await Inspector(redis, service=service).stream_status(names["poison"])
        assert dead.state is StreamState.DEAD_LETTERED

    # The consumer stopped (its session is gone); the dead consumer still has its
    # orphan pending, so only the stopped one's name may go.
    dry = await cli(url, "consumers", "prune", "--service", service, "--dry-run", "--json", *flags)
    assert dry.returncode == 0, dry.stderr
    would = json.loads(dry.stdout)["pruned"]
    lbs = Keys(service).assignments
    assert would[lbs] == [consumer.consumer_name]
    assert consumer.consumer_name in await consumer_names(redis, lbs, service)
    pruned = await cli(url, "consumers", "prune", "--service", service, "--json", *flags)
    assert json.loads(pruned.stdout)["pruned"][lbs] == [consumer.consumer_name]
    assert await consumer_names(redis, lbs, service) == ["dead-consumer"]


async def producer_add(redis: Any, service: str, stream: str) -> None:
    await Producer(redis, service=service).add_stream(stream)


async def consumer_names(redis: Any, stream: str, group: str) -> list[str]:
    return sorted(c["name"].decode() for c in await redis.xinfo_consumers(stream, group))


async def test_unknown_service_and_unreachable_redis_are_one_line_errors(
    request: pytest.FixtureRequest, redis: Any, service: str
) -> None:
    url, flags = url_of(request, redis)
    for command in (
        ["status"],
        ["dlq", "list"],
        ["dlq", "purge", "--all"],
        ["cancel", "some-stream"],
        ["consumers", "prune"],
    ):
        done = await cli(url, *command, "--service", service, *flags)
        assert done.returncode == 1, (command, done.stdout, done.stderr)
        assert done.stderr.count("\n") == 1, done.stderr
        assert f"no service {service!r}" in done.stderr
    gone = await cli("redis://127.0.0.1:1/0", "dlq", "list", "--service", service)
    assert gone.returncode == 2
    assert gone.stderr.startswith("streamjobs: error: cannot reach Redis")
    assert gone.stderr.count("\n") == 1


async def test_status_watch_refreshes_until_interrupted(
    request: pytest.FixtureRequest, redis: Any, service: str
) -> None:
    """``--watch`` stops on SIGINT with status 0, also when it was started with SIGINT
    ignored, as a background job of a script is (CI's jobs are): it hung there."""
    url, flags = url_of(request, redis)
    await redis.xgroup_create(Keys(service).assignments, service, id="0", mkstream=True)
    command = [sys.executable, "-m", "streamjobs", "status", "--service", service]
    # Started with SIGINT ignored, as a script's background job is.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        process = await anyio.open_process(
            [*command, "--watch", "0.2", "--json", *flags],
            cwd=ROOT,
            env={**os.environ, "STREAMJOBS_REDIS_URL": url, "PYTHONPATH": str(ROOT)},
        )
    finally:
        signal.signal(signal.SIGINT, previous)
    async with process:
        assert process.stdout is not None
        assert process.stderr is not None
        output = b""
        with anyio.fail_after(30):
            while output.count(b"\n") < 2:  # refreshed at least once
                output += await process.stdout.receive()
        # JSON Lines: each refresh one document on one line.
        documents = [json.loads(line) for line in output.split(b"\n")[:2]]
        assert [d["service"]["name"] for d in documents] == [service, service]
        process.send_signal(signal.SIGINT)
        try:
            with anyio.fail_after(10):
                assert await process.wait() == 0
        finally:
            if process.returncode is None:
                process.kill()  # else leaving the block would wait for it forever
        errors = b""
        with contextlib.suppress(anyio.EndOfStream):
            while True:
                errors += await process.stderr.receive()
        assert b"Traceback" not in errors


async def test_cancel_of_an_unknown_stream_is_one_line_and_exit_1(
    request: pytest.FixtureRequest, redis: Any, service: str, uid: str
) -> None:
    url, flags = url_of(request, redis)
    await redis.xgroup_create(Keys(service).assignments, service, id="0", mkstream=True)
    done = await cli(url, "cancel", f"nothing:{uid}", "--service", service, *flags)
    assert done.returncode == 1, done.stdout
    assert done.stdout == ""
    assert done.stderr == (
        f"streamjobs: error: nothing:{uid}: not found: no unfinished assignment and no lock "
        f"in service {service!r}; nothing done\n"
    )


async def test_a_reader_that_goes_away_ends_the_output_quietly(
    request: pytest.FixtureRequest, redis: Any, service: str
) -> None:
    """``streamjobs status --watch ... | head -1``: once the reader has gone, the next
    write fails on the closed pipe; that ends the command with 141 and no traceback."""
    url, flags = url_of(request, redis)
    await redis.xgroup_create(Keys(service).assignments, service, id="0", mkstream=True)

    def run() -> tuple[int, str]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "streamjobs", "status", "--service", service,
             "--watch", "0.05", *flags],
            cwd=ROOT,
            env={**os.environ, "STREAMJOBS_REDIS_URL": url, "PYTHONPATH": str(ROOT)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        with proc:
            assert proc.stdout is not None
            assert proc.stderr is not None
            first = proc.stdout.readline()
            proc.stdout.close()
            try:
                code = proc.wait(timeout=30)
            finally:
                proc.kill()
            assert first.startswith(f"service {service}"), first
            return code, proc.stderr.read()

    code, err = await anyio.to_thread.run_sync(run)
    assert (code, err) == (141, "")


async def test_nothing_pending_gives_no_oldest_age_and_purge_all_wants_a_yes(
    request: pytest.FixtureRequest, redis: Any, service: str, uid: str
) -> None:
    url, flags = url_of(request, redis)
    keys = Keys(service)
    await redis.xgroup_create(keys.assignments, service, id="0", mkstream=True)
    status = await cli(url, "status", "--service", service, *flags)
    assert status.returncode == 0, status.stderr
    assert status.stdout.splitlines()[0] == (
        f"service {service}: 0 owned, 0 pending without an owner, 0 queued; 0 dead letter(s)"
    )
    await redis.xadd(keys.dead_letters, {"_dlq_reason": "rejected", "_source_stream": "s"})
    refused = await cli(url, "dlq", "purge", "--all", "--service", service, *flags)
    assert refused.returncode == 2
    assert refused.stderr == (
        f"streamjobs: error: dlq purge --all would delete all 1 dead letter(s) of service "
        f"{service!r}: add --yes to confirm\n"
    )
    assert await redis.xlen(keys.dead_letters) == 1
    done = await cli(url, "dlq", "purge", "--all", "--yes", "--service", service, *flags)
    assert done.returncode == 0, done.stderr
    assert await redis.xlen(keys.dead_letters) == 0
