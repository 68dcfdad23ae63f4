"""Bad input and odd server states, against real Redis (the fake-driven side of these
cases is tests/unit/test_hardening.py)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from redis.asyncio import Redis as AsyncRedis
from redis.exceptions import ConnectionError as RedisConnectionError

from streamjobs import (
    ClusterMode,
    ConfigurationError,
    ConsumerConfig,
    DeadLetterReason,
    InvalidStreamName,
    NullRecorder,
    Producer,
    RecoveryConfig,
)
from streamjobs._deadletter import parse_dead_letter
from streamjobs._keys import Keys
from streamjobs._recovery import Recoverer
from streamjobs._recovery_loops import RecoveryLoops
from streamjobs._redis import Gateway
from tests.harness.plugin import ConsumerFactory, RedisServerFactory

from ._helpers import Recorder, eventually

pytestmark = pytest.mark.anyio

FAST = ConsumerConfig(lock_ttl_s=2, read_block_ms=50, handler_backoff_s=0.01)
RECOVERY = RecoveryConfig(min_idle_s=3, interval_s=1)


def decoded(fields: dict[bytes, bytes]) -> dict[str, str]:
    return {k.decode(): v.decode("utf-8", "replace") for k, v in fields.items()}


async def dead_letters(redis: AsyncRedis, service: str) -> list[Any]:
    return [
        parse_dead_letter(i.decode(), decoded(f))
        for i, f in await redis.xrange(Keys(service).dead_letters)
    ]


async def assert_nothing_held(redis: AsyncRedis, service: str, streams: list[str]) -> None:
    keys = Keys(service)
    for s in streams:
        assert await redis.exists(keys.lock(s)) == 0, f"lock of {s} left behind"
    assert (await redis.xpending(keys.assignments, service))["pending"] == 0
    assert await redis.zcard(keys.leases) == 0


async def test_a_client_that_decodes_responses_is_refused(redis_url: str, service: str) -> None:
    client = AsyncRedis.from_url(redis_url, decode_responses=True)
    try:
        with pytest.raises(ConfigurationError, match="decode_responses") as caught:
            Recorder(client, service=service)
        assert caught.value.field == "redis"
    finally:
        await client.aclose()


async def test_poison_assignments_are_dead_lettered_and_intake_goes_on(
    redis: AsyncRedis, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    keys = Keys(service)
    c = consumer_factory(Recorder, config=FAST, recovery=RECOVERY)
    good = f"data:{uid}"
    bad: list[dict[str, Any]] = [
        {"stream": f"s:{uid}", "info": "[" * 100_000},  # RecursionError in json
        {"stream": keys.assignments},  # would consume the assignments as data
        {"stream": keys.lock(f"x:{uid}")},
    ]
    async with c:
        for fields in bad:
            await redis.xadd(keys.assignments, fields)
        producer = Producer(redis, service=service)
        await producer.add_stream(good)
        await producer.append(good, {"n": "0"})
        await producer.close_stream(good)

        async def done() -> bool:
            return good in c.ended and await redis.xlen(keys.dead_letters) == len(bad)

        await eventually(done)
    records = await dead_letters(redis, service)
    assert {r.reason for r in records} == {DeadLetterReason.UNPARSEABLE}
    assert "RecursionError" in records[0].error
    assert all("reserved" in r.error for r in records[1:])
    assert await redis.exists(keys.assignments) == 1  # not deleted by a "finish"
    await assert_nothing_held(redis, service, [good])


async def test_the_producer_refuses_reserved_names(redis: AsyncRedis, service: str) -> None:
    producer = Producer(redis, service=service)
    keys = Keys(service)
    for call in (
        producer.add_stream(keys.dead_letters),
        producer.append(keys.leases, {"n": "1"}),
        producer.close_stream(keys.lock("x")),
    ):
        with pytest.raises(InvalidStreamName, match="reserved"):
            await call


async def test_a_data_stream_of_the_wrong_type_is_dead_lettered(
    redis: AsyncRedis, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    stream = f"data:{uid}"
    await redis.set(stream, "not a stream")
    c = consumer_factory(Recorder, config=FAST, recovery=RECOVERY)
    async with c:
        await Producer(redis, service=service).add_stream(stream, {"k": 1})

        async def dead() -> bool:
            return await redis.xlen(Keys(service).dead_letters) == 1

        await eventually(dead)
    [record] = await dead_letters(redis, service)
    assert record.reason is DeadLetterReason.UNUSABLE_STREAM
    assert record.error.startswith("WrongKeyType: ")
    assert "WRONGTYPE" in record.error
    assert json.loads(record.fields["info"]) == {"k": 1}
    assert await redis.get(stream) == b"not a stream"
    assert await redis.xlen(Keys(service).assignments) == 0
    await assert_nothing_held(redis, service, [stream])


async def test_a_data_stream_deleted_while_owned_frees_everything(
    redis: AsyncRedis, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    stream = f"data:{uid}"
    producer = Producer(redis, service=service)
    c = consumer_factory(Recorder, config=FAST, recovery=RECOVERY)
    async with c:
        await producer.add_stream(stream)
        await producer.append(stream, {"n": "0"})

        async def handled() -> bool:
            return len(c.handled) == 1

        await eventually(handled)
        await redis.delete(stream)
        await producer.append(stream, {"n": "1"})  # a new, group-less stream of that name

        async def freed() -> bool:
            return not c.owned_streams and stream in c.ended

        await eventually(freed)
    assert c.lost == []
    await assert_nothing_held(redis, service, [stream])
    assert await redis.xlen(Keys(service).assignments) == 0


async def test_a_retried_acquire_refreshes_the_lock_ttl(redis: AsyncRedis, service: str) -> None:
    gw = Gateway(redis, Keys(service))
    stream = f"data:{service}"
    assert await gw.streams.acquire(stream, "me:1", 5000)
    await redis.pexpire(Keys(service).lock(stream), 200)
    assert await gw.streams.acquire(stream, "me:1", 5000)  # a client retry finds its own token
    assert await redis.pttl(Keys(service).lock(stream)) > 4000


async def test_a_stream_name_reused_within_its_retention_loses_nothing(
    redis: AsyncRedis, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    stream = f"data:{uid}"
    producer = Producer(redis, service=service)
    config = ConsumerConfig(lock_ttl_s=2, read_block_ms=50, finished_stream_ttl_s=2)
    c = consumer_factory(Recorder, config=config, recovery=RECOVERY)
    async with c:
        for job in range(2):
            await producer.add_stream(stream, {"job": job})
            assert await redis.ttl(stream) in (-1, -2), "the old retention survived"
            for i in range(4):
                await producer.append(stream, {"n": f"{job}.{i}"})
            await producer.close_stream(stream)

            async def ended(job: int = job) -> bool:
                return c.ended.count(stream) == job + 1

            await eventually(ended)
            assert await redis.pttl(stream) > 0  # the retention of the job just finished
    assert [h[3] for h in c.handled] == [f"{j}.{i}" for j in range(2) for i in range(4)]


async def test_keyspace_flags_come_back_after_a_restart_without_persistence(
    redis_server_factory: RedisServerFactory, service: str
) -> None:
    server = redis_server_factory()
    client = AsyncRedis.from_url(server.url)
    try:
        c = Recorder(client, service=service, config=FAST, recovery=RECOVERY)
        async with c:

            async def flags() -> str:
                try:
                    reply = await client.config_get("notify-keyspace-events")
                except RedisConnectionError:  # the test's own connection, cut by the restart
                    return ""
                return str(reply["notify-keyspace-events"])

            async def set_() -> bool:
                return set(await flags()) >= set("Kx")

            await eventually(set_)
            server.restart()  # no AOF, no RDB: the flags are gone
            await eventually(set_, timeout_s=20)
    finally:
        await client.aclose()


@pytest.mark.parametrize("policy", ["allkeys-lru", "volatile-ttl"])
async def test_an_evicting_server_is_refused_unless_allowed(
    redis_server_factory: RedisServerFactory,
    service: str,
    caplog: pytest.LogCaptureFixture,
    policy: str,
) -> None:
    """Under volatile-ttl locks go first; under allkeys-lru the assignment stream
    itself: by default a consumer does not start, and says why."""
    server = redis_server_factory(extra_args=["--maxmemory-policy", policy])
    client = AsyncRedis.from_url(server.url)
    try:
        strict = Recorder(client, service=service, config=FAST, recovery=RECOVERY)
        with pytest.raises(ConfigurationError, match=policy) as caught:
            await strict.run()
        assert caught.value.field == "maxmemory-policy"
        lenient = Recorder(
            client,
            service=service,
            config=dataclasses.replace(FAST, require_noeviction=False),
            recovery=RECOVERY,
        )
        async with lenient:
            pass
        assert f"maxmemory-policy is '{policy}'" in caplog.text
    finally:
        await client.aclose()


async def test_consumer_names_that_are_gone_are_pruned_and_live_ones_kept(
    redis: AsyncRedis, service: str, uid: str
) -> None:
    keys = Keys(service)
    gw = Gateway(redis, keys)
    await gw.assignments.ensure_group()
    stream = f"data:{uid}"
    await Producer(redis, service=service).add_stream(stream)
    await redis.xreadgroup(service, "holds-work", {keys.assignments: ">"}, count=1)
    for name in ("dead-1", "dead-2", "me"):
        await redis.xgroup_createconsumer(keys.assignments, service, name)

    async def names() -> set[str]:
        return {c["name"].decode() for c in await redis.xinfo_consumers(keys.assignments, service)}

    assert await gw.liveness.prune_consumers(60_000, "me") == []  # nobody idle for a minute yet
    pruned = await gw.liveness.prune_consumers(0, "me")
    assert sorted(pruned) == ["dead-1", "dead-2"]
    assert await names() == {"holds-work", "me"}  # pending work and ourselves stay
    assert (await redis.xpending(keys.assignments, service))["pending"] == 1


async def test_one_unrecoverable_entry_does_not_stop_the_scan_page(
    redis: AsyncRedis, service: str, uid: str
) -> None:
    keys = Keys(service)
    gw = Gateway(redis, keys)
    await gw.assignments.ensure_group()
    poison = (await redis.xadd(keys.assignments, {"info": "{}"})).decode()  # unparseable
    await Producer(redis, service=service).add_stream(f"data:{uid}")
    await redis.xreadgroup(service, "ghost", {keys.assignments: ">"}, count=2)
    await redis.set(keys.dead_letters, "not a stream")  # the poison cannot be moved there
    errors: list[str] = []

    class Errors(NullRecorder):
        def loop_error(self, service: str, loop: str) -> None:
            errors.append(loop)

    metrics = Errors()
    loops = RecoveryLoops(
        redis,
        gw,
        Recoverer(gw, max_retries=3, metrics=metrics, service=service),
        recovery=RecoveryConfig(min_idle_s=0.001),
        consumer=ConsumerConfig(),
        cluster_mode=ClusterMode.PROXY,
        metrics=metrics,
    )

    async def both_idle() -> bool:  # XPENDING IDLE counts whole milliseconds
        page = await redis.xpending_range(keys.assignments, service, "-", "+", 10, idle=2)
        return len(page) == 2

    await eventually(both_idle)
    assert (await loops.scan_once())[0] == 2
    assert errors == ["recover"]
    pending = await redis.xpending_range(keys.assignments, service, "-", "+", 10)
    assert [p["message_id"].decode() for p in pending] == [poison]  # still there, not lost
    [(_, requeued)] = [
        (i, f) for i, f in await redis.xrange(keys.assignments) if i.decode() != poison
    ]
    assert requeued[b"_retry_count"] == b"1"  # the entry behind it was recovered
