"""A replayed dead entry keeps where it came from: its job's ``info`` and its original
id, against real Redis."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from redis.asyncio import Redis as AsyncRedis

from streamjobs import (
    ConsumerConfig,
    DeadLetter,
    DeadLetters,
    Message,
    Producer,
    StreamConsumer,
)
from streamjobs._keys import Keys
from tests.harness.plugin import ConsumerFactory

from ._helpers import eventually

pytestmark = pytest.mark.anyio


class Rejecting(StreamConsumer):
    """Rejects "bad" until ``fixed``; records what it saw and each job's info."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fixed = False
        self.seen: list[tuple[str, str, str | None]] = []
        self.starts: list[dict[str, Any]] = []
        self.ended = 0

    async def handle(self, message: Message) -> None:
        if message.fields["n"] == "bad" and not self.fixed:
            raise DeadLetter("bad for now")
        self.seen.append((message.fields["n"], message.id, message.replayed_from))

    async def on_stream_start(self, stream: str, info: Mapping[str, Any]) -> None:
        self.starts.append(dict(info))

    async def on_stream_end(self, stream: str) -> None:
        self.ended += 1


async def test_a_replay_after_the_job_ended_keeps_its_info_and_origin(
    redis: AsyncRedis, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    stream = f"d:{uid}"
    producer = Producer(redis, service=service)
    await producer.add_stream(stream, {"customer": 42})
    bad_id = await producer.append(stream, {"n": "bad"})
    await producer.append(stream, {"n": "ok"})
    await producer.close_stream(stream)
    c = consumer_factory(Rejecting, config=ConsumerConfig(read_block_ms=200))
    async with c:

        async def first_job_done() -> bool:
            return bool(c.ended == 1)

        await eventually(first_job_done)
        letters = DeadLetters(redis, service=service)
        [record] = await letters.list()
        assert record.info == {"customer": 42}
        c.fixed = True
        report = await letters.replay([record.id])
        [done] = report.replayed
        assert done.reassigned, "the job had ended: the replay must start a new one"

        async def replay_handled() -> bool:
            return bool(c.ended == 2)

        await eventually(replay_handled)
    assert c.starts == [{"customer": 42}, {"customer": 42}]
    assert c.seen[0] == ("ok", c.seen[0][1], None)
    n, new_id, origin = c.seen[1]
    assert (n, origin) == ("bad", bad_id)
    assert new_id != bad_id
    assert await redis.xlen(Keys(service).dead_letters) == 0
