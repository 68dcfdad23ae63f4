"""Reads of data streams, against real Redis: fenced without carrying data through
Lua, sized by bytes, ordered across a stalled owner, and patient with BUSY.

docs/operations.md#size-and-time-limits states the limits tested here.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from redis.asyncio import Redis as AsyncRedis
from redis.exceptions import ResponseError

from streamjobs import ConsumerConfig, DeadLetter, Message, Producer, RecoveryConfig
from streamjobs._keys import Keys
from streamjobs._redis import Gateway
from tests.harness.plugin import ConsumerFactory, RedisServerFactory

from ._helpers import Recorder, eventually

pytestmark = pytest.mark.anyio

MB = 1024 * 1024


async def test_a_stalled_owners_read_is_claimed_by_its_successor_in_order(
    redis: Any, service: str, uid: str
) -> None:
    """The read that a stalled owner queued behind its failed fence pulls newer entries
    into its own pending list; the successor claims them before reading further."""
    keys = Keys(service)
    gw = Gateway(redis, keys)
    stream = f"data:{uid}"
    producer = Producer(redis, service=service)
    ids = [await producer.append(stream, {"n": str(i)}) for i in range(10)]
    assert await gw.streams.acquire(stream, "A:1", 60_000)
    first = await gw.streams.fenced_read(stream, "A:1", "A", 2, [])
    assert [i for i, _ in first.entries] == ids[:2]
    await redis.set(keys.lock(stream), "B:1")  # B took over (A's lock expired)
    took_over = await gw.streams.fenced_read(stream, "B:1", "B", 2, [])
    assert [i for i, _ in took_over.entries] == ids[:2], "A's pending entries come first"
    stale = await gw.streams.fenced_read(stream, "A:1", "A", 2, [])
    assert not stale.owned
    assert stale.entries == []
    pending = await redis.xpending_range(stream, service, "-", "+", 10)
    # A's read ran although its fence failed: the newest pending entries are A's.
    assert pending[-1]["consumer"] == b"A"
    assert pending[-1]["message_id"].decode() in ids[2:]
    seen: list[str] = [i for i, _ in took_over.entries]
    ack = seen[:]
    reply = took_over
    while True:
        reply = await gw.streams.fenced_read(stream, "B:1", "B", 2, ack, claim=reply.claimed)
        assert reply.owned
        if not reply.entries:
            break
        ack = [i for i, _ in reply.entries]
        seen += ack
    assert seen == ids, "B handled entries out of order or missed some"
    assert reply.top == ids[-1]
    assert (await redis.xpending(stream, service))["pending"] == 0


async def test_big_entries_are_read_one_at_a_time_and_no_script_carries_them(
    redis_server_factory: RedisServerFactory, service: str, uid: str
) -> None:
    """50 MB entries are handled, not dead-lettered; every read of them asks for one
    entry, and no script call is slow (none carries entry data). Smaller entries that
    follow are read in batches sized by ``read_batch_bytes``."""
    server = redis_server_factory(
        extra_args=["--slowlog-log-slower-than", "0", "--slowlog-max-len", "100000"]
    )
    client = AsyncRedis.from_url(server.url)
    stream = f"data:{uid}"
    sizes = [50 * MB] * 3 + [400 * 1024] * 8 + [100] * 300
    seen: list[int] = []

    class Sizes(Recorder):
        async def handle(self, message: Message) -> None:
            seen.append(len(message.fields["blob"]))

    try:
        producer = Producer(client, service=service)
        for size in sizes:
            await producer.append(stream, {"blob": b"x" * size})
        await producer.close_stream(stream)
        await producer.add_stream(stream)
        await client.slowlog_reset()
        config = ConsumerConfig(read_batch_bytes=MB, read_batch_size=100)
        consumer = Sizes(client, service=service, config=config, recovery=RecoveryConfig())
        async with consumer:

            async def done() -> bool:
                return consumer.ended == [stream]

            await eventually(done, timeout_s=120)
        log = await client.slowlog_get(100_000)
        assert await client.xlen(Keys(service).dead_letters) == 0
    finally:
        await client.aclose()
    assert seen == sizes
    commands = [_text(entry["command"]).split() for entry in reversed(log)]
    counts = [
        int(c[c.index("COUNT") + 1])
        for c in commands
        if c[0] == "XREADGROUP" and c[-2] == stream and c[-1] == ">"
    ]
    # The first read takes one entry; 50 MB entries go one at a time; 400 KB ones two
    # at a time (1 MB / 400 KB); the small ones in full batches.
    assert counts[:4] == [1, 1, 1, 1], counts
    assert set(counts[4:8]) <= {1, 2}, counts
    assert 2 in counts[4:8], counts
    assert max(counts) == 100, counts
    slow_scripts = [
        (_text(e["command"])[:60], e["duration"])
        for e in log
        if _text(e["command"]).split()[0] in {"EVALSHA", "EVAL", "FCALL"}
        and e["duration"] > 100_000
    ]
    assert slow_scripts == [], "a script call took over 100 ms"


async def test_a_busy_server_is_waited_out_not_dead_lettered(
    redis_server_factory: RedisServerFactory,
    service: str,
    uid: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """BUSY (another client's script past the server's script time limit) is a
    transient state: the owner keeps its stream and carries on when it ends."""
    server = redis_server_factory(extra_args=["--lua-time-limit", "50"])
    client = AsyncRedis.from_url(server.url)
    hog = AsyncRedis.from_url(server.url)
    stream = f"data:{uid}"
    try:
        producer = Producer(client, service=service)
        await producer.add_stream(stream)
        await producer.append(stream, {"n": "0"})
        config = ConsumerConfig(lock_ttl_s=10, read_block_ms=20)
        consumer = Recorder(client, service=service, config=config, recovery=RecoveryConfig())
        async with consumer:

            async def first() -> bool:
                return len(consumer.handled) == 1

            await eventually(first)
            async with anyio.create_task_group() as tg:
                # Busy for 1.5 s by the server's clock: every other command gets BUSY.
                tg.start_soon(
                    hog.eval,
                    "local t = redis.call('TIME') local s = tonumber(t[1]) * 1000000 + "
                    "tonumber(t[2]) repeat t = redis.call('TIME') until "
                    "tonumber(t[1]) * 1000000 + tonumber(t[2]) - s > 1500000 return 1",
                    0,
                )

                async def busy() -> bool:
                    try:
                        await client.ping()
                    except ResponseError as exc:
                        return str(exc).startswith("BUSY")
                    return False

                await eventually(busy, interval_s=0.01)
            # The hog is done: everything the consumer tried meanwhile got BUSY.
            await producer.append(stream, {"n": "1"})
            await producer.close_stream(stream)

            async def ended() -> bool:
                return consumer.ended == [stream]

            await eventually(ended)
        assert [h[3] for h in consumer.handled] == ["0", "1"]
        assert "BUSY" in caplog.text, "the consumer never met the busy server"
        assert consumer.lost == []
        assert await client.xlen(Keys(service).dead_letters) == 0
    finally:
        await hog.aclose()
        await client.aclose()


def _text(value: bytes | str | int) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@pytest.mark.parametrize("how", ["deleted", "taken"])
async def test_a_lock_that_vanishes_early_stops_handing_entries_at_once(
    redis: Any, service: str, uid: str, consumer_factory: ConsumerFactory, how: str
) -> None:
    """A lock deleted (or given to another owner) long before its TTL and before any
    heartbeat: at most the call in flight runs; no further entry of the batch is
    handed to ``handle()``, the loss is reported, and nothing more is acked."""
    keys = Keys(service)
    stream = f"data:{uid}"
    producer = Producer(redis, service=service)
    await producer.add_stream(stream)
    ids = [await producer.append(stream, {"n": str(i)}) for i in range(20)]
    in_third = anyio.Event()
    go_on = anyio.Event()
    handled: list[str] = []

    class Blocking(Recorder):
        async def handle(self, message: Message) -> None:
            handled.append(message.id)
            if message.id == ids[2]:
                in_third.set()
                await go_on.wait()

    # A 60 s TTL: the heartbeat (every 20 s) cannot be what notices.
    config = ConsumerConfig(lock_ttl_s=60, read_block_ms=50)
    consumer = consumer_factory(Blocking, config=config)
    async with consumer:
        with anyio.fail_after(20):
            await in_third.wait()
        if how == "deleted":
            await redis.delete(keys.lock(stream))
        else:
            await redis.set(keys.lock(stream), "someone-else:1")
        await anyio.sleep(0.1)  # time passes: the lock was last proved ours > 50 ms ago
        go_on.set()

        async def lost() -> bool:
            return consumer.lost == [stream]

        await eventually(lost)
    assert handled[-1] == ids[2], f"entries handed on after the loss: {handled[3:]}"
    pending = await redis.xpending(stream, service)
    assert pending["pending"] >= len(ids) - 3, "entries after the loss were acked"


async def test_a_big_entry_is_dead_lettered_whole_without_a_script(
    redis_server_factory: RedisServerFactory, service: str, uid: str
) -> None:
    """A failing 2 MB entry goes to the dead-letter stream byte for byte, by a plain
    XADD: no script call carries its data."""
    server = redis_server_factory(
        extra_args=["--slowlog-log-slower-than", "0", "--slowlog-max-len", "100000"]
    )
    client = AsyncRedis.from_url(server.url)
    stream = f"data:{uid}"
    blob = bytes(range(256)) * (8 * 1024)  # 2 MB, not valid UTF-8

    class Refuses(Recorder):
        async def handle(self, message: Message) -> None:
            raise DeadLetter("refused")

    try:
        producer = Producer(client, service=service)
        await producer.append(stream, {"blob": blob, "n": "0"})
        await producer.close_stream(stream)
        await producer.add_stream(stream)
        await client.slowlog_reset()
        consumer = Refuses(client, service=service)
        async with consumer:

            async def ended() -> bool:
                return consumer.ended == [stream]

            await eventually(ended)
        dlq = Keys(service).dead_letters
        letters = await client.xrange(dlq)
        log = await client.slowlog_get(100_000)
    finally:
        await client.aclose()
    assert len(letters) == 1
    fields = letters[0][1]
    assert fields[b"blob"] == blob
    assert fields[b"n"] == b"0"
    assert fields[b"_dlq_reason"] == b"rejected"
    commands = [_text(e["command"]).split(" ", 2)[:2] for e in log]
    assert ["XADD", dlq] in commands, "the dead letter was not a plain XADD"
