"""A consumer object run again after it stopped: the second ``run()`` keeps running until
stopped, each run is a new session incarnation, and a lock left by the earlier run is
taken over, not seen as alive."""

from __future__ import annotations

import json

import anyio
import pytest
from redis.asyncio import Redis as AsyncRedis

from streamjobs import Producer, RecoveryConfig
from streamjobs._keys import Keys
from streamjobs._redis import Gateway
from streamjobs._session import session_token
from tests.harness.plugin import ConsumerFactory

from ._helpers import SESSION, Recorder, eventually, true

pytestmark = pytest.mark.anyio


async def _incarnation(redis: AsyncRedis, service: str, consumer: str) -> str:
    value = await redis.get(Keys(service).session(consumer))
    assert value is not None, f"consumer {consumer!r} has no session"
    found = json.loads(value)["incarnation"]
    assert isinstance(found, str)
    return found


async def test_a_second_run_keeps_running_until_stopped(
    redis: AsyncRedis, service: str, consumer_factory: ConsumerFactory
) -> None:
    c = consumer_factory(Recorder, config=SESSION)
    async with c:
        pass
    returned = anyio.Event()

    async def run_again() -> None:
        await c.run()
        returned.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(run_again)
        with anyio.fail_after(10):
            await c.wait_ready()
        # A run whose stop signal was left set returns within ~0.3 s by itself.
        with anyio.move_on_after(2):
            await returned.wait()
        assert not returned.is_set(), "the second run() returned without being stopped"
        assert c.statistics().running
        await c.aclose()
        with anyio.fail_after(10):
            await returned.wait()


async def test_each_run_is_a_new_session_incarnation(
    redis: AsyncRedis, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    name = f"c-{uid}"
    c = consumer_factory(Recorder, config=SESSION, consumer_name=name)
    async with c:
        first = await _incarnation(redis, service, name)
    # As if the first run had stopped hard and failed to release a lock: the lock it
    # left names its incarnation.
    stream = f"d:{uid}"
    gw = Gateway(redis, Keys(service))
    await redis.set(Keys(service).lock(stream), session_token(first, name, service), px=600_000)
    async with c:
        second = await _incarnation(redis, service, name)
        assert second != first
        assert not await gw.liveness.lock_alive(stream), "the first run's session came back"


async def test_a_lock_left_by_an_earlier_run_does_not_bounce_its_assignment(
    redis: AsyncRedis, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    """The whole case: the earlier run's lock is taken over, not seen as alive (which
    re-queued the assignment as contended until it was dead-lettered)."""
    name = f"c-{uid}"
    stream = f"d:{uid}"
    recovery = RecoveryConfig(interval_s=30, lease_check_interval_s=0.2, max_retries=1)
    c = consumer_factory(Recorder, config=SESSION, recovery=recovery, consumer_name=name)
    async with c:
        first = await _incarnation(redis, service, name)
    await redis.set(Keys(service).lock(stream), session_token(first, name, service), px=600_000)
    producer = Producer(redis, service=service)
    await producer.add_stream(stream)
    await producer.append(stream, {"n": "0"})
    await producer.close_stream(stream)
    async with c:
        await eventually(lambda: true(c.ended == [stream]), timeout_s=15)
    assert [n for _, _, _, n in c.handled] == ["0"]
    assert await redis.xlen(Keys(service).dead_letters) == 0
    assert await redis.exists(Keys(service).lock(stream)) == 0
