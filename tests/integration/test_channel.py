"""The command channel on real Redis (docs/design.md#the-command-channel): what many
tasks send in one turn goes out in one write per node, replies reach their callers in
order, an error reply fails only its caller, a dropped connection fails only what was
in flight, a cancelled caller leaves the connection in step, and a script the server
lost is loaded again."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
from redis import exceptions as rex
from redis.asyncio import Redis as AsyncRedis

from streamjobs._keys import Keys
from streamjobs._redis import Channel, Gateway
from tests.harness.keys import delete_keys_containing

pytestmark = pytest.mark.anyio


def _node_keys(uid: str, n: int) -> list[str]:
    """``n`` keys in different slots (on a cluster, spread over its primaries)."""
    return [f"chan:{uid}:{i}" for i in range(n)]


async def test_one_turn_of_calls_is_one_write_per_node_and_each_caller_gets_its_reply(
    redis: Any, uid: str
) -> None:
    channel = Channel(redis)
    keys = _node_keys(uid, 6)
    calls = [(keys[i % len(keys)], i) for i in range(300)]
    replies: dict[int, Any] = {}

    async def push(key: str, i: int) -> None:
        replies[i] = await channel.call(key, "RPUSH", key, str(i))

    async with anyio.create_task_group() as tg:
        for key, i in calls:
            tg.start_soon(push, key, i)

    nodes = 1
    if hasattr(redis, "get_node_from_key"):
        nodes = len({redis.get_node_from_key(k).name for k in keys})
    assert channel.commands == 300
    assert channel.batches == nodes  # one write per node for the whole turn
    for key in keys:
        pushed = [int(v) for v in await redis.lrange(key, 0, -1)]
        assert pushed == sorted(pushed)  # in the order they were called
        # RPUSH answers the list's new length: the n-th push on a key got n.
        assert sorted(replies[i] for i in pushed) == list(range(1, len(pushed) + 1))
        assert [replies[i] for i in pushed] == list(range(1, len(pushed) + 1))


async def test_an_error_reply_fails_its_caller_only(redis: Any, uid: str) -> None:
    channel = Channel(redis)
    key = f"chan:{uid}:{{k}}"
    other = f"chan:{uid}:{{k}}:list"
    await redis.rpush(other, "x")
    outcomes: dict[str, Any] = {}

    async def run(name: str, *command: Any) -> None:
        try:
            outcomes[name] = await channel.call(key, *command)
        except rex.ResponseError as exc:
            outcomes[name] = exc

    async with anyio.create_task_group() as tg:
        tg.start_soon(run, "before", "INCR", key)
        tg.start_soon(run, "wrong type", "INCR", other)
        tg.start_soon(run, "after", "INCR", key)

    assert channel.batches == 1
    assert outcomes["before"] == 1
    assert isinstance(outcomes["wrong type"], rex.ResponseError)
    assert "WRONGTYPE" in str(outcomes["wrong type"])
    assert outcomes["after"] == 2


async def test_transactions_stay_contiguous_among_plain_commands(redis: Any, uid: str) -> None:
    channel = Channel(redis)
    key = f"chan:{uid}:{{t}}"
    blocks: list[Any] = []
    singles: list[Any] = []

    async def block() -> None:
        blocks.append(await channel.transaction(key, [("INCR", key), ("INCR", key)]))

    async def single() -> None:
        singles.append(await channel.call(key, "INCR", key))

    async with anyio.create_task_group() as tg:
        for i in range(60):
            tg.start_soon(block if i % 2 else single)

    assert int(await redis.get(key)) == 30 * 2 + 30
    for first, second in blocks:  # nothing ran between a block's two commands
        assert second == first + 1
    values = sorted([v for b in blocks for v in b] + singles)
    assert values == list(range(1, 91))


async def test_an_error_queued_in_a_block_is_the_blocks_answer(redis: Any, uid: str) -> None:
    channel = Channel(redis)
    key = f"chan:{uid}:{{e}}"
    with pytest.raises(rex.ResponseError):
        await channel.transaction(key, [("INCR", key), ("NOSUCHCOMMAND", key)])
    assert await redis.get(key) is None  # EXECABORT: nothing ran
    assert await channel.call(key, "INCR", key) == 1  # the connection is in step


@pytest.fixture
async def admin(redis_url: str, uid: str) -> AsyncIterator[AsyncRedis]:
    """A client on the standalone server (these tests kill connections by id), whose
    keys containing ``uid`` are deleted afterwards."""
    client = AsyncRedis.from_url(redis_url)
    try:
        yield client
    finally:
        try:
            await delete_keys_containing(client, uid)
        finally:
            await client.aclose()


async def _channel_client_id(redis: AsyncRedis, name: str) -> int:
    """The id of the connection named ``name`` once it is blocked in BLPOP."""
    with anyio.fail_after(10):
        while True:
            for client in await redis.client_list():
                if client.get("name") == name and client.get("cmd") == "blpop":
                    return int(client["id"])
            await anyio.sleep(0.01)


@pytest.fixture
async def named(redis_url: str, uid: str) -> AsyncIterator[tuple[Channel, str]]:
    """A channel on a client of its own, whose connections carry a name, so that a
    test can find (and kill) the channel's connection; the client is closed after."""
    name = f"chan-{uid}"
    own = AsyncRedis.from_url(redis_url, client_name=name)
    try:
        yield Channel(own), name
    finally:
        await own.aclose()


async def test_a_dropped_connection_fails_what_was_in_flight_and_the_next_call_reconnects(
    named: tuple[Channel, str], admin: AsyncRedis, uid: str
) -> None:
    channel, name = named
    key = f"chan:{uid}:drop"
    results: dict[str, Any] = {}

    async def run(label: str, *command: Any) -> None:
        try:
            results[label] = await channel.call(key, *command)
        except Exception as exc:
            results[label] = exc

    async with anyio.create_task_group() as tg:
        tg.start_soon(run, "blpop", "BLPOP", f"{key}:list", 30)
        tg.start_soon(run, "incr", "INCR", key)  # same write, behind the BLPOP
        await admin.client_kill_filter(_id=await _channel_client_id(admin, name))

    assert isinstance(results["blpop"], rex.ConnectionError)
    assert isinstance(results["incr"], rex.ConnectionError)
    assert await admin.get(key) is None  # the INCR behind it never ran
    assert await channel.call(key, "INCR", key) == 1  # on a new connection


async def test_a_cancelled_caller_leaves_the_connection_in_step(
    named: tuple[Channel, str], admin: AsyncRedis, uid: str
) -> None:
    channel, name = named
    key = f"chan:{uid}:cancel"
    queued_done = asyncio.Event()

    async def queued_behind() -> None:
        await channel.call(key, "SET", key, "queued")
        queued_done.set()

    async with anyio.create_task_group() as tg:
        # In flight: a BLPOP whose caller goes away; queued behind it (next write): a
        # SET whose caller goes away before it is written.
        tg.start_soon(channel.call, key, "BLPOP", f"{key}:list", 30)
        await _channel_client_id(admin, name)
        tg.start_soon(queued_behind)
        await anyio.wait_all_tasks_blocked()
        tg.cancel_scope.cancel()

    assert not queued_done.is_set()
    await admin.rpush(f"{key}:list", "wake")  # the BLPOP's reply, read and dropped
    assert await channel.call(key, "GET", key) is None  # the SET was never written
    assert await channel.call(key, "ECHO", "in step") == b"in step"


async def test_a_script_the_server_lost_is_loaded_again(redis: Any, uid: str, service: str) -> None:
    gateway = Gateway(redis, Keys(service))
    gateway.scripts.channel = channel = Channel(redis)
    stream = f"data:{uid}"
    await redis.script_flush()
    assert await gateway.streams.acquire(stream, "me:1", 5000)
    assert channel.commands >= 3  # EVALSHA (NOSCRIPT), SCRIPT LOAD, EVALSHA
    assert await redis.get(gateway.keys.lock(stream)) == b"me:1"


async def test_a_read_that_may_be_large_goes_on_a_connection_of_its_own(
    redis: Any, uid: str, service: str
) -> None:
    from streamjobs._redis._channel import LARGE_REPLY_BYTES

    gateway = Gateway(redis, Keys(service))
    gateway.scripts.channel = channel = Channel(redis)
    stream = f"data:{uid}"
    for i in range(5):
        await redis.xadd(stream, {"n": str(i)})
    assert await gateway.streams.acquire(stream, "me:1", 5000)
    await gateway.assignments.load_scripts()  # another test may have flushed them
    before = channel.commands

    small = await gateway.streams.fenced_read(stream, "me:1", "me", 2, [], reply_bytes=100)
    on_channel = channel.commands - before
    acked = [entry_id for entry_id, _ in small.entries]
    large = await gateway.streams.fenced_read(
        stream, "me:1", "me", 3, acked, reply_bytes=LARGE_REPLY_BYTES + 1
    )

    assert on_channel == 4  # MULTI, fence.lua, XREADGROUP, EXEC
    assert channel.commands - before == on_channel  # the large read did not use it
    read = small.entries + large.entries
    assert [f["n"] for _, f in read] == [str(i) for i in range(5)]


async def test_claimed_entries_are_fetched_over_the_channel(
    redis: Any, uid: str, service: str
) -> None:
    keys = Keys(service)
    gateway = Gateway(redis, keys)
    gateway.scripts.channel = channel = Channel(redis)
    stream = f"data:{uid}"
    ids = [await redis.xadd(stream, {"n": str(i)}) for i in range(250)]
    assert await gateway.streams.acquire(stream, "old:1", 5000)
    assert len((await gateway.streams.fenced_read(stream, "old:1", "old", 250, [])).entries) == 250
    await redis.xack(stream, keys.group, *ids[5:200])  # more than one XRANGE carries
    await redis.set(keys.lock(stream), "new:1")
    before = channel.commands

    claimed = await gateway.streams.fenced_read(stream, "new:1", "new", 250, [], claim=True)

    expected = [*range(5), *range(200, 250)]
    assert [f["n"] for _, f in claimed.entries] == [str(i) for i in expected]
    assert claimed.claimed
    assert channel.commands > before


async def test_gateway_steps_wait_for_room_on_the_channel_before_building_commands(
    redis: Any, uid: str, service: str
) -> None:
    gateway = Gateway(redis, Keys(service))
    gateway.scripts.channel = channel = Channel(redis)
    channel.room = asyncio.Semaphore(1)
    stream = f"data:{uid}"
    taken: list[int] = []

    async def acquire() -> None:
        taken.append(await gateway.streams.acquire(stream, "me:1", 5000))

    await channel.room.acquire()  # the one place is taken
    async with anyio.create_task_group() as tg:
        tg.start_soon(acquire)
        await anyio.wait_all_tasks_blocked()
        assert channel.commands == 0  # nothing sent while there is no room
        assert await redis.get(gateway.keys.lock(stream)) is None
        channel.room.release()
    assert taken == [1]
    assert await redis.get(gateway.keys.lock(stream)) == b"me:1"
