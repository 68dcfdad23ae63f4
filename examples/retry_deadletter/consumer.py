"""Retry(delay_s=...) and DeadLetter(reason=...) in a handler, and what reaches the DLQ.

    python examples/retry_deadletter/consumer.py [REDIS_URL]

One stream of four payments goes through a handler that:

* handles ``ok`` at once;
* raises ``Retry(delay_s=0.2)`` for ``flaky`` until its third attempt, which succeeds;
* raises ``DeadLetter(reason=...)`` for ``invalid``: dead-lettered at once, no retry;
* raises ``RuntimeError`` for ``broken`` every time: retried with backoff, then
  dead-lettered (``handler_failed``) after ``max_handler_attempts``; a ``DeadLetter``
  is reason ``rejected``, its text kept in ``_rejected``.

Then it prints the dead-letter stream through ``DeadLetters``. Within a stream entries
stay in order: each retry holds the stream until the entry is done, and after a dead
letter the next entry follows.
"""

from __future__ import annotations

import sys
import uuid
from typing import Any

import anyio
from redis.asyncio import Redis

from streamjobs import (
    ConsumerConfig,
    DeadLetter,
    DeadLetters,
    Message,
    Producer,
    Retry,
    StreamConsumer,
)
from streamjobs.testing import redis_for_script

MAX_ATTEMPTS = 4
PAYMENTS = [
    {"payment": "p1", "kind": "ok", "amount": "10"},
    {"payment": "p2", "kind": "flaky", "amount": "20"},
    {"payment": "p3", "kind": "invalid", "amount": "-5"},
    {"payment": "p4", "kind": "broken", "amount": "40"},
]


class Payments(StreamConsumer):
    def __init__(self, redis: Any, **kwargs: Any) -> None:
        super().__init__(redis, **kwargs)
        self.handled: list[str] = []
        self.done = anyio.Event()

    async def handle(self, message: Message) -> None:
        payment, kind = message.fields["payment"], message.fields["kind"]
        print(f"  {payment} ({kind}) attempt {message.attempt}")
        if kind == "flaky" and message.attempt < 3:
            raise Retry(delay_s=0.2)  # the gateway timed out: try again in 200 ms
        if kind == "invalid":
            # Retrying cannot help: dead-letter it now, with a reason.
            raise DeadLetter(reason=f"amount must be positive, got {message.fields['amount']}")
        if kind == "broken":
            raise RuntimeError("payment gateway returned 500")  # a bug: retried, then DLQ
        self.handled.append(payment)

    async def on_stream_end(self, stream: str) -> None:
        self.done.set()


async def main(url: str) -> int:
    redis = Redis.from_url(url)
    service = f"retry-dlq-{uuid.uuid4().hex[:8]}"
    stream = f"{service}:payments"
    print(f"service {service}")
    config = ConsumerConfig(
        max_handler_attempts=MAX_ATTEMPTS,  # attempts per entry, Retry ones included
        handler_backoff_s=0.05,  # after a plain exception: 0.05 s, 0.1 s, 0.2 s, ...
        finished_stream_ttl_s=0,
    )
    consumer = Payments(redis, service=service, config=config)
    try:
        producer = Producer(redis, service=service)
        await producer.add_stream(stream)
        for payment in PAYMENTS:
            await producer.append(stream, payment)
        await producer.close_stream(stream)
        async with consumer:
            with anyio.fail_after(20):
                await consumer.done.wait()

        letters = DeadLetters(redis, service=service)
        records = await letters.list()  # oldest first; filters: reason=, source_stream=, ...
        print(f"handled: {', '.join(consumer.handled)}")
        print(f"dead letters in {letters.stream}: {len(records)}")
        for r in records:
            reason = r.reason.value if r.reason else "?"
            print(f"  {r.id} {r.fields['payment']} reason={reason} attempts={r.attempts}")
            print(f"      error: {r.error}")
            print(f"      from {r.source_stream} {r.source_id}; fields {dict(r.fields)}")
    finally:
        if keys := [k async for k in redis.scan_iter(match=f"*{service}*")]:
            await redis.delete(*keys)
        await redis.aclose()
    dead = sorted(r.fields["payment"] for r in records)
    if consumer.handled != ["p1", "p2"] or dead != ["p3", "p4"]:
        print(f"FAILED: handled {consumer.handled}, dead-lettered {dead}")
        return 1
    print(f"done: handled {len(consumer.handled)} (p2 after 2 retries), dead-lettered {len(dead)}")
    return 0


if __name__ == "__main__":
    with redis_for_script(__doc__.splitlines()[0]) as url:
        code = anyio.run(main, url)
    sys.exit(code)
