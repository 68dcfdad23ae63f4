"""The smallest complete streamjobs program: python examples/minimal/consumer.py [REDIS_URL]"""

from __future__ import annotations

import uuid
from typing import Any

import anyio
from redis.asyncio import Redis

from streamjobs import ConsumerConfig, Message, Producer, StreamConsumer
from streamjobs.testing import redis_for_script


class Greeter(StreamConsumer):
    def __init__(self, redis: Any, **kwargs: Any) -> None:
        super().__init__(redis, **kwargs)
        self.handled = 0
        self.finished = anyio.Semaphore(0)  # released once per finished stream

    async def handle(self, message: Message) -> None:  # in order within a stream
        self.handled += 1
        print(f"  {message.stream} {message.id}: {message.fields['text']}")

    async def on_stream_end(self, stream: str) -> None:  # after its end marker
        print(f"  {stream} finished")
        self.finished.release()


async def main(url: str) -> None:
    redis, service = Redis.from_url(url), f"minimal-{uuid.uuid4().hex[:8]}"
    print(f"service {service}")
    streams = [f"{service}:greetings:{n}" for n in (1, 2)]
    producer = Producer(redis, service=service)
    consumer = Greeter(redis, service=service, config=ConsumerConfig(finished_stream_ttl_s=0))
    try:
        for stream in streams:
            await producer.add_stream(stream)  # queue the job: a consumer will own it
            await producer.append(stream, {"text": "hello"})
            await producer.append(stream, {"text": "world"})
            await producer.close_stream(stream)  # the end-of-stream marker
        async with consumer:  # runs the consumer until the block ends
            with anyio.fail_after(20):
                for _ in streams:
                    await consumer.finished.acquire()
    finally:  # every key this run made carries the service name
        if keys := [k async for k in redis.scan_iter(match=f"*{service}*")]:
            await redis.delete(*keys)
        await redis.aclose()
    print(f"done: {len(streams)} streams finished, {consumer.handled} entries handled")


if __name__ == "__main__":
    with redis_for_script(__doc__.splitlines()[0]) as url:
        anyio.run(main, url)
