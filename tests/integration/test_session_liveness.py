"""``Liveness.SESSION`` against real Redis: O(1) heartbeats, dead sessions recovered by
the sweep, their locks taken over, a replaced session losing its streams.

The kill -9 and SIGSTOP cases run in tests/faults/test_recovery_faults.py, for both
liveness modes.
"""

from __future__ import annotations

import dataclasses
import json
import secrets
from typing import Any

import anyio
import pytest
from redis.asyncio import Redis as AsyncRedis

from streamjobs import ConfigurationError, ConsumerConfig, Liveness, Producer, RecoveryConfig
from streamjobs._keys import Keys
from streamjobs._session import member, session_token
from tests.harness.plugin import ConsumerFactory

from ._helpers import Recorder, eventually, true

pytestmark = pytest.mark.anyio

SESSION = ConsumerConfig(
    lock_ttl_s=1.0, liveness=Liveness.SESSION, read_block_ms=100, max_concurrent_streams=20
)
FAST = RecoveryConfig(interval_s=30, lease_check_interval_s=0.2)


async def queue(redis: AsyncRedis, service: str, streams: list[str], *, close: bool) -> None:
    producer = Producer(redis, service=service)
    for s in streams:
        await producer.add_stream(s)
        await producer.append(s, {"n": "0"})
        if close:
            await producer.close_stream(s)


def test_liveness_must_be_the_enum() -> None:
    with pytest.raises(ConfigurationError) as info:
        ConsumerConfig(liveness="session")
    assert info.value.field == "liveness"


async def test_heartbeats_renew_the_session_not_the_locks(
    redis: AsyncRedis, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    streams = [f"d:{uid}:{i}" for i in range(5)]
    await queue(redis, service, streams, close=False)
    keys = Keys(service)
    c = consumer_factory(Recorder, config=SESSION, recovery=FAST, consumer_name="s1")
    async with c:
        await eventually(lambda: true(len(c.handled) == 5))
        session = await redis.get(keys.session("s1"))
        assert session is not None
        incarnation = json.loads(session)["incarnation"]
        locks = [await redis.get(keys.lock(s)) for s in streams]
        assert all(t is not None and t.decode().startswith(f"~s:{incarnation}:") for t in locks)
        assert await redis.zscore(keys.sessions, member(incarnation, "s1")) is not None
        # Three heartbeats (lock TTL 1 s): the session's TTL is renewed, each lock's
        # long TTL only counts down, and every stream is still owned.
        before = [await redis.pttl(keys.lock(s)) for s in streams]
        await eventually(lambda: _session_renewed(redis, keys.session("s1")), timeout_s=5)
        await anyio.sleep(1.2)  # past one lock TTL: a lock on the 1 s TTL would be gone
        after = [await redis.pttl(keys.lock(s)) for s in streams]
        assert all(a < b for a, b in zip(after, before, strict=True)), (before, after)
        assert min(after) > SESSION.session_lock_ttl_ms - 10_000
        assert c.owned_streams == frozenset(streams)
        assert not c.lost
    # A clean stop ends the session and hands every stream back; with nothing left
    # pending with it, its index member goes too: nothing is left indexed.
    assert await redis.get(keys.session("s1")) is None
    assert all([await redis.get(keys.lock(s)) is None for s in streams])
    assert await redis.zcard(keys.sessions) == 0


async def test_a_stop_that_leaves_an_assignment_pending_keeps_its_member_due(
    redis: AsyncRedis, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    """What a stop could not hand back (here an assignment read under the consumer's
    name behind its back, as by a read whose reply it never got) is found by a sweeper
    through the member, which falls due at once instead of going."""
    keys = Keys(service)
    one = dataclasses.replace(SESSION, max_concurrent_streams=1)  # its one slot stays full
    c = consumer_factory(Recorder, config=one, recovery=FAST, consumer_name="s1")
    async with c:
        incarnation = json.loads(await redis.get(keys.session("s1")))["incarnation"]
        await queue(redis, service, [f"d:{uid}:0"], close=False)
        await eventually(lambda: true(len(c.handled) == 1))
        await queue(redis, service, [f"d:{uid}:1"], close=False)
        reply: Any = await redis.xreadgroup(service, "s1", {keys.assignments: ">"}, count=1)
        assert len(reply[0][1]) == 1
    assert await redis.get(keys.session("s1")) is None
    score = await redis.zscore(keys.sessions, member(incarnation, "s1"))
    assert score is not None, "the member went although an assignment is pending with s1"
    now_s, now_us = await redis.time()
    assert score <= now_s * 1000 + now_us // 1000, "the member is not due"


async def _session_renewed(redis: AsyncRedis, key: str) -> bool:
    return int(await redis.pttl(key)) > 900


async def strand_with_dead_session(
    redis: AsyncRedis, service: str, streams: list[str], ghost: str
) -> str:
    """Assignments read by ``ghost``, whose session died holding their locks."""
    keys = Keys(service)
    await redis.xgroup_create(keys.assignments, service, id="0", mkstream=True)
    await queue(redis, service, streams, close=True)
    reply: Any = await redis.xreadgroup(service, ghost, {keys.assignments: ">"}, count=99)
    assert len(reply[0][1]) == len(streams)
    incarnation = secrets.token_hex(8)
    for s in streams:
        await redis.xgroup_create(s, service, id="0", mkstream=True)
        await redis.set(keys.lock(s), session_token(incarnation, ghost, service))
    # Its session key expired; its index member is past its deadline.
    await redis.zadd(keys.sessions, {member(incarnation, ghost): 1})
    return incarnation


@pytest.mark.parametrize("liveness", [Liveness.LOCK, Liveness.SESSION])
async def test_a_dead_session_is_recovered_by_any_consumer(
    liveness: Liveness,
    redis: AsyncRedis,
    service: str,
    uid: str,
    consumer_factory: ConsumerFactory,
) -> None:
    streams = [f"d:{uid}:{i}" for i in range(3)]
    keys = Keys(service)
    incarnation = await strand_with_dead_session(redis, service, streams, "ghost")
    config = ConsumerConfig(
        lock_ttl_s=1.0, liveness=liveness, read_block_ms=100, finished_stream_ttl_s=0
    )
    # The scan is far off: the session sweep alone must find the dead session.
    recovery = RecoveryConfig(interval_s=600, min_idle_s=600, lease_check_interval_s=0.2)
    c = consumer_factory(Recorder, config=config, recovery=recovery, consumer_name="live")
    async with c:
        await eventually(lambda: true(sorted(c.ended) == sorted(streams)), timeout_s=15)
    assert sorted(s for _, s, _, _ in c.handled) == sorted(streams)
    # The dead locks were taken over and released; the member went.
    assert all([await redis.get(keys.lock(s)) is None for s in streams])
    assert await redis.zscore(keys.sessions, member(incarnation, "ghost")) is None
    assert (await redis.xpending(keys.assignments, service))["pending"] == 0
    assert await redis.xlen(keys.assignments) == 0


async def test_a_replaced_session_loses_its_streams_and_they_are_recovered(
    redis: AsyncRedis, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    streams = [f"d:{uid}:{i}" for i in range(3)]
    keys = Keys(service)
    await queue(redis, service, streams, close=False)
    c = consumer_factory(Recorder, config=SESSION, recovery=FAST, consumer_name="s1")
    async with c:
        await eventually(lambda: true(c.owned_streams == frozenset(streams)))
        first = json.loads(await redis.get(keys.session("s1")))["incarnation"]
        # As if the session had expired and a restart under the same name had begun.
        await redis.set(keys.session("s1"), json.dumps({"incarnation": "f" * 16}), px=60_000)
        await eventually(lambda: true(sorted(c.lost) == sorted(streams)), timeout_s=10)
        # A new incarnation starts; the sweep recovers the old one's streams, and this
        # very consumer takes them again under its new session.
        await eventually(lambda: true(c.owned_streams == frozenset(streams)), timeout_s=15)
        second = json.loads(await redis.get(keys.session("s1")))["incarnation"]
        assert second not in (first, "f" * 16)
        producer = Producer(redis, service=service)
        for s in streams:
            await producer.append(s, {"n": "1"})
            await producer.close_stream(s)
        await eventually(lambda: true(sorted(c.ended) == sorted(streams)), timeout_s=15)
    assert sorted(n for _, _, _, n in c.handled if n == "1") == ["1", "1", "1"]
    assert (await redis.xpending(keys.assignments, service))["pending"] == 0
    assert all([await redis.get(keys.lock(s)) is None for s in streams])
