"""The fleet's consumer, run by the CLI (``handlers:Resizer``)::

    PYTHONPATH=examples/fleet streamjobs worker handlers:Resizer --service images

Each stream is an album; each entry one image to resize. What a worker did is
recorded in Redis, under keys named after the service, so ``run.py`` (another
process) can check that every image was handled, and by whom.
"""

from __future__ import annotations

import anyio

from streamjobs import Message, StreamConsumer


def result_key(service: str, what: str) -> str:
    """``handled`` (hash "stream|entry id" -> times handled), ``by_consumer`` (hash
    consumer -> images handled) or ``finished`` (hash album -> the consumer that
    finished it). One hash tag: a MULTI may write them all, on a cluster too."""
    return f"resizer:{{{service}}}:{what}"


class Resizer(StreamConsumer):
    async def handle(self, message: Message) -> None:
        await anyio.sleep(float(message.info.get("work_ms", 50)) / 1000)  # the resizing
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hincrby(result_key(self.service, "handled"), f"{message.stream}|{message.id}")
            pipe.hincrby(result_key(self.service, "by_consumer"), self.consumer_name)
            await pipe.execute()

    async def on_stream_end(self, stream: str) -> None:
        await self.redis.hset(result_key(self.service, "finished"), stream, self.consumer_name)
