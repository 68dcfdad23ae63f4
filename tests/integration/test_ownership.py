"""Core runtime behaviour against real Redis."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import anyio
import pytest
from redis.asyncio import Redis as AsyncRedis

from streamjobs import (
    ConsumerConfig,
    DeadLetter,
    DeadLetterReason,
    Liveness,
    Message,
    Producer,
    RecoveryConfig,
)
from streamjobs._deadletter import parse_dead_letter
from streamjobs._keys import Keys
from streamjobs._redis import Gateway
from tests.harness.plugin import ConsumerFactory

from ._helpers import Recorder, eventually

pytestmark = pytest.mark.anyio

FAST = ConsumerConfig(lock_ttl_s=2, read_block_ms=50, handler_backoff_s=0.01)
RECOVERY = RecoveryConfig(min_idle_s=3, interval_s=1)


# Recovery that stays out of the way for the length of a test.
NO_RECOVERY = RecoveryConfig(min_idle_s=300, interval_s=300, lease_check_interval_s=300)

# Recovery that may find a dead owner but never hands its stream back: the first
# recovery of an assignment dead-letters it (max_retries_exceeded).
NO_REQUEUE = RecoveryConfig(
    min_idle_s=300, interval_s=300, lease_check_interval_s=300, max_retries=0
)


MakeConsumer = Callable[..., Recorder]


@pytest.fixture
def make_consumer(consumer_factory: ConsumerFactory) -> MakeConsumer:
    """``make_consumer(cls, recovery=RECOVERY, **cfg)``: a consumer on the test's ``redis``
    with the FAST config, ``cfg`` overriding its fields; closed at teardown."""

    def make(cls: type[Recorder], recovery: RecoveryConfig = RECOVERY, **cfg: Any) -> Recorder:
        config = dataclasses.replace(FAST, **cfg)
        return consumer_factory(cls, config=config, recovery=recovery)

    return make


async def assert_nothing_left(redis: AsyncRedis, service: str, streams: list[str]) -> None:
    keys = Keys(service)
    for s in streams:
        assert await redis.exists(keys.lock(s)) == 0, f"lock of {s} left behind"
        pending = await redis.xpending(s, service)
        assert pending["pending"] == 0, f"{s} has pending entries"
    lbs = await redis.xpending(keys.assignments, service)
    assert lbs["pending"] == 0
    assert await redis.xlen(keys.assignments) == 0
    assert await redis.zcard(keys.leases) == 0


async def produce(producer: Producer, streams: list[str], entries: int) -> None:
    for s in streams:
        await producer.add_stream(s, {"name": s})
    for i in range(entries):
        for s in streams:
            await producer.append(s, {"n": str(i)})
    for s in streams:
        await producer.close_stream(s)


async def test_two_consumers_handle_every_entry_once_in_order(
    redis: AsyncRedis, service: str, uid: str, make_consumer: MakeConsumer
) -> None:
    streams = [f"data:{uid}:{i}" for i in range(20)]
    a = make_consumer(Recorder)
    b = make_consumer(Recorder)
    async with a, b:
        await produce(Producer(redis, service=service), streams, 50)

        async def all_ended() -> bool:
            return len(a.ended) + len(b.ended) == len(streams)

        await eventually(all_ended, timeout_s=30)
    handled = a.handled + b.handled
    assert len(handled) == 20 * 50
    assert len({(s, i) for _, s, i, _ in handled}) == 20 * 50, "an entry was handled twice"
    for s in streams:
        ns = [int(n) for _, st, _, n in handled if st == s]
        owners = {c for c, st, _, _ in handled if st == s}
        assert ns == list(range(50)), f"{s} out of order"
        assert len(owners) == 1
    assert a.handled, "consumer a got no work"
    assert b.handled, "consumer b got no work"
    await assert_nothing_left(redis, service, streams)


class Blocking(Recorder):
    """Blocks in handle() on entry n=0 until released."""

    entered: anyio.Event
    release: anyio.Event

    async def handle(self, message: Message) -> None:
        if message.fields["n"] == "0":
            self.entered.set()
            await self.release.wait()
        await super().handle(message)


@pytest.mark.parametrize("liveness", [Liveness.LOCK, Liveness.SESSION])
@pytest.mark.parametrize("how", ["delete", "overwrite"])
async def test_lost_lock_stops_handing_entries_and_refuses_acks(
    redis: AsyncRedis,
    service: str,
    uid: str,
    make_consumer: MakeConsumer,
    how: str,
    liveness: Liveness,
) -> None:
    stream = f"data:{uid}"
    # What is checked is the disowned acquisition, so recovery must not hand the stream
    # back to this same consumer under a new lock. Long intervals do not keep it away
    # (the sweep wakes at the lease deadline, and a deleted lock is a dead owner), so
    # recovery may run but cannot re-queue: with max_retries=0 its one move is to
    # dead-letter the assignment, which leaves the data stream as the loss left it.
    c = make_consumer(Blocking, recovery=NO_REQUEUE, liveness=liveness)
    assert isinstance(c, Blocking)
    c.entered, c.release = anyio.Event(), anyio.Event()
    async with c:
        await produce(Producer(redis, service=service), [stream], 5)
        with anyio.fail_after(10):
            await c.entered.wait()
        lock = Keys(service).lock(stream)
        if how == "delete":
            await redis.delete(lock)
        else:
            await redis.set(lock, "someone-else:token", px=60_000)

        async def lost() -> bool:
            return stream in c.lost

        if liveness is Liveness.SESSION:
            # The heartbeat renews the session, not the lock: the loss is found by
            # the fenced read after the call in flight.
            c.release.set()
        await eventually(lost, timeout_s=10)
        c.release.set()
        # Give the consumer every chance to (wrongly) go on: it must not.
        await anyio.sleep(FAST.heartbeat_s * 2)
        assert [n for _, _, _, n in c.handled] == ["0"]
        assert stream not in c.owned_streams
    pending = await redis.xpending_range(stream, service, "-", "+", 100)
    pending_ids = {p["message_id"].decode() for p in pending}
    [(_, _, handled_id, _)] = c.handled
    assert handled_id in pending_ids, "the disowned consumer acked its in-flight entry"
    if how == "overwrite":
        assert await redis.get(lock) == b"someone-else:token"
    else:
        assert await redis.exists(lock) == 0, "the former owner re-created the lock"


async def test_fenced_read_refuses_a_stale_token(redis: AsyncRedis, service: str, uid: str) -> None:
    gw = Gateway(redis, Keys(service))
    stream = f"data:{uid}"
    await Producer(redis, service=service).append(stream, {"n": "0"})
    assert await gw.streams.acquire(stream, "me:1", 5000)
    ok, _, batch, *_ = await gw.streams.fenced_read(stream, "me:1", "me", 10, [])
    assert ok
    assert [f["n"] for _, f in batch] == ["0"]
    await redis.set(Keys(service).lock(stream), "other:2")
    assert not (await gw.streams.fenced_read(stream, "me:1", "me", 10, [batch[0][0]])).owned
    assert (await redis.xpending(stream, service))["pending"] == 1


class Slow(Recorder):
    async def handle(self, message: Message) -> None:
        await anyio.sleep(0.02)  # slow on purpose: entries stay in flight a while
        await super().handle(message)


async def test_graceful_shutdown_hands_the_stream_back_at_once(
    redis: AsyncRedis, service: str, uid: str, make_consumer: MakeConsumer
) -> None:
    stream = f"data:{uid}"
    # A long TTL: a takeover through expiry would take >= 10 s, a hand-back much less.
    a = make_consumer(Slow, recovery=NO_RECOVERY, lock_ttl_s=10)
    await produce(Producer(redis, service=service), [stream], 60)
    async with a:

        async def started() -> bool:
            return len(a.handled) >= 5

        await eventually(started)
    assert stream not in a.ended
    done_by_a = {i for _, _, i, _ in a.handled}
    keys = Keys(service)
    assert await redis.exists(keys.lock(stream)) == 0, "the lock was not released"
    [(_, fields)] = list(await redis.xrange(keys.assignments) or [])
    assert fields.get(b"_retry_count", b"0") == b"0", "a hand-back must not count a retry"
    b = make_consumer(Slow, recovery=NO_RECOVERY, lock_ttl_s=10)
    t0 = time.monotonic()
    async with b:

        async def finished() -> bool:
            return stream in b.ended

        await eventually(finished, timeout_s=8)
    assert time.monotonic() - t0 < 5
    done_by_b = {i for _, _, i, _ in b.handled}
    assert not done_by_a & done_by_b, "an entry was handled twice"
    assert len(done_by_a | done_by_b) == 60
    assert [int(n) for _, _, _, n in a.handled + b.handled] == list(range(60))
    await assert_nothing_left(redis, service, [stream])


class Failing(Recorder):
    attempts: dict[str, int]

    async def handle(self, message: Message) -> None:
        if message.fields["n"] == "2":
            self.attempts[message.id] = message.attempt
            raise RuntimeError("boom on 2")
        if message.fields["n"] == "4":
            raise DeadLetter("bad payload")
        await super().handle(message)


async def test_failing_handler_dead_letters_the_entry_and_goes_on(
    redis: AsyncRedis, service: str, uid: str, make_consumer: MakeConsumer
) -> None:
    stream = f"data:{uid}"
    c = make_consumer(Failing, max_handler_attempts=3)
    assert isinstance(c, Failing)
    c.attempts = {}
    async with c:
        await produce(Producer(redis, service=service), [stream], 6)

        async def ended() -> bool:
            return stream in c.ended

        await eventually(ended)
    assert [n for _, _, _, n in c.handled] == ["0", "1", "3", "5"]
    assert list(c.attempts.values()) == [3]
    dlq = list(await redis.xrange(Keys(service).dead_letters) or [])
    assert len(dlq) == 2
    (_id2, f2), (_, f4) = dlq
    assert f2[b"_dlq_reason"] == b"handler_failed"
    assert f2[b"_error"] == b"RuntimeError: boom on 2"
    assert f2[b"_source_stream"] == stream.encode()
    assert f2[b"_source_id"].decode() in c.attempts
    assert f2[b"n"] == b"2"
    assert f2[b"_attempts"] == b"3"
    assert f2[b"_owner"] == c.consumer_name.encode()
    assert int(f2[b"_dead_at_ms"]) > 0
    assert f4[b"_error"] == b"DeadLetter: bad payload"
    # What the script wrote parses back into the typed record.
    record = parse_dead_letter(_id2.decode(), {k.decode(): v.decode() for k, v in f2.items()})
    assert record.reason is DeadLetterReason.HANDLER_FAILED
    assert (record.source_stream, record.attempts, record.owner) == (stream, 3, c.consumer_name)
    assert record.fields == {"n": "2"}
    assert not record.is_assignment
    assert record.dead_at_ms is not None
    await assert_nothing_left(redis, service, [stream])


async def test_malformed_assignments_are_dead_lettered_and_intake_goes_on(
    redis: AsyncRedis, service: str, uid: str, make_consumer: MakeConsumer
) -> None:
    keys = Keys(service)
    bad: list[dict[str, Any]] = [
        {"info": "{}"},
        {"stream": f"s:{uid}", "info": "{nope"},
        {"stream": f"s:{uid}", "info": "[1,2]"},
        {"stream": b"\xff\xfe\x00junk"},
        {"stream": f"bad}}{uid}"},
        {"stream": f"s:{uid}", "_retry_count": "many"},
        {"lbs-input": "not json"},
        {"stream": f"s:{uid}", "info": "x" * 100_000 + "{"},
    ]
    c = make_consumer(Recorder)
    good = f"data:{uid}"
    async with c:
        for fields in bad:
            await redis.xadd(keys.assignments, fields)
        await produce(Producer(redis, service=service), [good], 3)

        async def ended() -> bool:
            return good in c.ended and await redis.xlen(keys.dead_letters) == len(bad)

        await eventually(ended)
    dlq = await redis.xrange(keys.dead_letters)
    assert {f[b"_dlq_reason"] for _, f in dlq} == {b"unparseable"}
    assert all(f[b"_error"] for _, f in dlq)
    assert all(f[b"_source_stream"] == keys.assignments.encode() for _, f in dlq)
    records = [
        parse_dead_letter(
            i.decode(), {k.decode(): v.decode("utf-8", "replace") for k, v in f.items()}
        )
        for i, f in dlq
    ]
    assert all(r.is_assignment and r.reason is DeadLetterReason.UNPARSEABLE for r in records)
    assert records[0].fields == {"info": "{}"}  # the original fields are kept
    assert [n for _, _, _, n in c.handled] == ["0", "1", "2"]
    await assert_nothing_left(redis, service, [good])


async def test_finished_stream_gets_a_ttl(
    redis: AsyncRedis, service: str, uid: str, make_consumer: MakeConsumer
) -> None:
    stream = f"data:{uid}"
    c = make_consumer(Recorder, finished_stream_ttl_s=120)
    async with c:
        await produce(Producer(redis, service=service), [stream], 1)

        async def ended() -> bool:
            return stream in c.ended

        await eventually(ended)
    assert 0 < await redis.pttl(stream) <= 120_000
