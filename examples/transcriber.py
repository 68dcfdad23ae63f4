"""A complete, runnable streamjobs example: produce three streams, consume them.

Run it against a Redis (the URL given, else ``$STREAMJOBS_REDIS_URL``, else a private
``redis-server`` for the run)::

    python examples/transcriber.py [REDIS_URL]

It prints each handled chunk and exits once every stream has finished.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

import anyio
from redis.asyncio import Redis

from streamjobs import ConsumerConfig, Message, Producer, RecoveryConfig, StreamConsumer
from streamjobs.testing import redis_for_script


class Transcriber(StreamConsumer):
    """Handles one chunk at a time, in order within each call."""

    def __init__(self, *args: Any, expected: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.expected = expected
        self.all_finished = anyio.Event()
        self.finished: set[str] = set()

    async def on_stream_start(self, stream: str, info: Mapping[str, Any]) -> None:
        print(f"start {stream} (language={info.get('language')})")

    async def handle(self, message: Message) -> None:
        print(f"  {message.stream} {message.fields['chunk']}")

    async def on_stream_end(self, stream: str) -> None:
        print(f"end   {stream}")
        self.finished.add(stream)
        if len(self.finished) == self.expected:
            self.all_finished.set()


async def main(url: str) -> None:
    redis = Redis.from_url(url)
    service = f"transcriber-example-{uuid.uuid4().hex[:8]}"
    calls = [f"call:{service}:{i}" for i in range(3)]
    producer = Producer(redis, service=service)
    for call in calls:
        await producer.add_stream(call, {"language": "en"})
        for n in range(3):
            await producer.append(call, {"chunk": f"chunk-{n}"})
        await producer.close_stream(call)  # the end-of-stream marker

    consumer = Transcriber(
        redis,
        service=service,
        expected=len(calls),
        config=ConsumerConfig(lock_ttl_s=10, finished_stream_ttl_s=0),
        recovery=RecoveryConfig(interval_s=30),
    )
    try:
        async with consumer:
            with anyio.fail_after(30):
                await consumer.all_finished.wait()
    finally:
        # The example cleans up after itself (finished streams are already deleted).
        await redis.delete(
            f"streamjobs:{{{service}}}:lbs",
            f"streamjobs:{{{service}}}:dlq",
            f"streamjobs:{{{service}}}:leases",
        )
        await redis.aclose()
    print(f"all {len(calls)} streams finished")


if __name__ == "__main__":
    with redis_for_script(__doc__.splitlines()[0]) as url:
        anyio.run(main, url)
