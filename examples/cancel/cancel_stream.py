"""Cancel jobs with Producer.cancel_stream: one still queued, one being processed.

    python examples/cancel/cancel_stream.py [REDIS_URL]

A consumer that owns one stream at a time (``max_concurrent_streams=1``) works through
a long export, 50 entries at 50 ms each. While it does:

* a second export is queued behind it and cancelled before any consumer read it:
  ``cancel_stream`` answers ``REMOVED`` and no consumer ever sees it;
* the running export is cancelled: ``SIGNALLED``. Its owner ends it within one read
  batch (``read_batch_size=5`` here): it skips the entries not handled yet, releases
  the stream and calls ``on_stream_cancelled(stream, reason)`` instead of
  ``on_stream_end``;
* cancelling it again finds nothing left to do: ``NOT_FOUND``.

From a shell: ``streamjobs cancel --service SERVICE STREAM --reason TEXT``.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Mapping
from typing import Any

import anyio
from redis.asyncio import Redis

from streamjobs import CancelOutcome, ConsumerConfig, Message, Producer, StreamConsumer
from streamjobs.testing import redis_for_script

ENTRIES = 50


class Exporter(StreamConsumer):
    def __init__(self, redis: Any, **kwargs: Any) -> None:
        super().__init__(redis, **kwargs)
        self.started: list[str] = []
        self.handled = 0
        self.busy = anyio.Event()  # set once a few rows are exported
        self.cancelled = anyio.Event()
        self.reason = ""

    async def on_stream_start(self, stream: str, info: Mapping[str, Any]) -> None:
        print(f"  started {stream}")
        self.started.append(stream)

    async def handle(self, message: Message) -> None:
        await anyio.sleep(0.05)  # exporting one row takes a while
        self.handled += 1
        if self.handled == 3:
            self.busy.set()

    async def on_stream_end(self, stream: str) -> None:
        print(f"  {stream} ended normally (not expected here)")

    async def on_stream_cancelled(self, stream: str, reason: str) -> None:
        print(f"  on_stream_cancelled({stream!r}, {reason!r}) after {self.handled} rows")
        self.reason = reason
        self.cancelled.set()


async def main(url: str) -> int:
    redis = Redis.from_url(url)
    service = f"cancel-{uuid.uuid4().hex[:8]}"
    running, queued = f"{service}:export:1", f"{service}:export:2"
    print(f"service {service}")
    # One stream at a time, read in small batches (a cancel takes effect within one).
    config = ConsumerConfig(max_concurrent_streams=1, read_batch_size=5)
    consumer = Exporter(redis, service=service, config=config)
    producer = Producer(redis, service=service)
    try:
        await producer.add_stream(running)
        for n in range(ENTRIES):
            await producer.append(running, {"row": str(n)})
        await producer.close_stream(running)
        async with consumer:
            with anyio.fail_after(20):
                await consumer.busy.wait()
            await producer.add_stream(queued)  # waits: the consumer's one slot is busy
            removed = await producer.cancel_stream(queued, reason="duplicate request")
            print(f"cancel {queued}: {removed.name}")
            signalled = await producer.cancel_stream(running, reason="customer cancelled")
            print(f"cancel {running}: {signalled.name}")
            with anyio.fail_after(20):
                await consumer.cancelled.wait()
            again = await producer.cancel_stream(running)
            print(f"cancel {running} again: {again.name}")
    finally:
        if keys := [k async for k in redis.scan_iter(match=f"*{service}*")]:
            await redis.delete(*keys)
        await redis.aclose()
    ok = (
        removed is CancelOutcome.REMOVED
        and signalled is CancelOutcome.SIGNALLED
        and again is CancelOutcome.NOT_FOUND
        and consumer.started == [running]
        and consumer.reason == "customer cancelled"
        and consumer.handled < ENTRIES
    )
    if not ok:
        print(f"FAILED: started {consumer.started}, handled {consumer.handled}/{ENTRIES}")
        return 1
    print(
        f"done: queued stream REMOVED, running stream SIGNALLED and cancelled after "
        f"{consumer.handled} of {ENTRIES} entries, then NOT_FOUND"
    )
    return 0


if __name__ == "__main__":
    with redis_for_script(__doc__.splitlines()[0]) as url:
        code = anyio.run(main, url)
    sys.exit(code)
