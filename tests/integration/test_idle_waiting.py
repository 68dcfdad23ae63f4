"""Idle streams share one blocking read (standalone servers): connections and
commands stay flat however many of a consumer's streams are idle, and a new entry on
any of them still wakes it."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

import anyio
import pytest
from redis.asyncio import Redis as AsyncRedis

from streamjobs import ConsumerConfig, NullRecorder, Producer
from streamjobs._keys import Keys
from streamjobs._redis import Gateway
from streamjobs._waiter import Waiter
from tests.harness.plugin import RedisServerFactory

from ._helpers import Recorder, eventually

pytestmark = pytest.mark.anyio

STREAMS = 300


async def _calls(client: Any, command: str) -> int:
    stats = await client.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


async def test_three_hundred_idle_streams_share_one_read_and_still_wake(
    redis_server_factory: RedisServerFactory, service: str, uid: str
) -> None:
    server = redis_server_factory()
    admin = AsyncRedis.from_url(server.url)
    client = AsyncRedis.from_url(server.url)
    streams = [f"idle:{uid}:{i}" for i in range(STREAMS)]
    try:
        producer = Producer(admin, service=service)
        for s in streams:
            await producer.add_stream(s)
        config = ConsumerConfig(max_concurrent_streams=STREAMS, read_block_ms=200)
        consumer = Recorder(client, service=service, config=config)
        async with consumer:

            async def all_owned_and_idle() -> bool:
                return len(consumer.started) == STREAMS

            await eventually(all_owned_and_idle, timeout_s=60)
            xread_before = await _calls(admin, "xread")
            with anyio.fail_after(10):
                await anyio.sleep(2.0)  # a window of idleness to count commands in
            xreads = await _calls(admin, "xread") - xread_before
            clients = int((await admin.info("clients"))["connected_clients"])
            # One XREAD per 200 ms block (plus one per unblock), not one per stream:
            # 300 streams blocking alone would have sent ~3,000 in 2 s.
            assert xreads <= 60, xreads
            # redis_concurrency (16) + blocking reads (4) + this test's admin client.
            assert clients <= 16 + 4 + 1, clients
            woken = random.Random(7).sample(streams, 20)
            for s in woken:
                await producer.append(s, {"n": s})

            async def all_handled() -> bool:
                return sorted(h[3] for h in consumer.handled) == sorted(woken)

            await eventually(all_handled, timeout_s=20)
    finally:
        await client.aclose()
        await admin.aclose()


async def test_a_wait_ends_by_its_own_future_and_a_second_wait_on_a_name_displaces_the_first(
    redis_url: str, service: str, uid: str
) -> None:
    """Each wait has its own future: resolving it ends that wait only (shutdown,
    finish() and a loss end a stream's wait this way), and a second wait on the same
    name (a stale owner of an earlier job beside the new one) wakes the first rather
    than leave it to sleep out its timer."""
    client = AsyncRedis.from_url(redis_url)
    gateway = Gateway(client, Keys(service))
    waiter = Waiter(client, gateway, block_ms=200, metrics=NullRecorder(), service=service)
    stream = f"wait:{uid}"
    try:
        # The stream exists and has nothing newer than ``last``: only a wake ends a
        # wait (the waiter wakes the waits of streams that do not exist).
        last = (await client.xadd(stream, {"n": "0"})).decode()
        async with anyio.create_task_group() as tg:
            await tg.start(waiter.run)
            loop = asyncio.get_running_loop()
            mine: asyncio.Future[None] = loop.create_future()
            other: asyncio.Future[None] = loop.create_future()
            ended: list[str] = []

            async def wait(name: str, woken: asyncio.Future[None]) -> None:
                await waiter.wait(stream, last, 60.0, woken)
                ended.append(name)

            tg.start_soon(wait, "first", mine)
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(wait, "second", other)
            with anyio.fail_after(2):
                await _until(lambda: ended == ["first"])  # displaced: it reads again
            await anyio.sleep(0.3)  # more than a blocking read: nothing else ends
            assert ended == ["first"]
            other.set_result(None)  # its owner ends it
            with anyio.fail_after(2):
                await _until(lambda: ended == ["first", "second"])
            tg.cancel_scope.cancel()
    finally:
        await client.delete(stream)
        await client.aclose()


async def _until(check: Callable[[], bool]) -> None:
    while not check():  # noqa: ASYNC110 - a plain list the waits append to
        await anyio.sleep(0.01)
