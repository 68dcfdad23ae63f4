"""Inspect dead letters, fix the handler, replay them: the DeadLetters API end to end.

    python examples/dlq/inspect_and_replay.py [REDIS_URL]

1. A consumer with a "bug" (it rejects the CHF currency) owns a stream of invoices:
   of the first five, the two in CHF are dead-lettered. The stream stays open (more
   invoices may come), so the consumer keeps owning it.
2. The dead-letter stream is inspected with ``DeadLetters``: ``length()``,
   ``list(reason=...)``, ``get(id)`` and ``select(DeadLetterFilter(...))``. Each step
   prints the ``streamjobs dlq ...`` command that shows the same thing.
3. The handler is "fixed" (CHF is accepted) and the dead letters are replayed (a dry
   run first): each is appended again at the tail of its stream, where the owner
   handles it, after the invoices written before the replay. Then the producer closes
   the stream, and the dead-letter stream is empty again.
"""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from redis.asyncio import Redis

from streamjobs import (
    ConsumerConfig,
    DeadLetter,
    DeadLetterFilter,
    DeadLetterReason,
    DeadLetters,
    Message,
    Producer,
    StreamConsumer,
)
from streamjobs.testing import redis_for_script

INVOICES = [
    ("inv-1", "EUR"),
    ("inv-2", "CHF"),
    ("inv-3", "USD"),
    ("inv-4", "CHF"),
    ("inv-5", "EUR"),
]


class Invoices(StreamConsumer):
    def __init__(self, redis: Any, **kwargs: Any) -> None:
        super().__init__(redis, **kwargs)
        self.currencies = {"EUR", "USD"}  # the "bug": CHF is missing
        self.handled: list[str] = []
        self.ended = anyio.Event()

    async def handle(self, message: Message) -> None:
        invoice, currency = message.fields["invoice"], message.fields["currency"]
        if currency not in self.currencies:
            raise DeadLetter(reason=f"unsupported currency {currency}")
        print(f"  handled {invoice} ({currency})")
        self.handled.append(invoice)

    async def on_stream_end(self, stream: str) -> None:
        self.ended.set()


async def until(what: str, check: Callable[[], Awaitable[bool]], timeout_s: float = 20) -> None:
    """Poll ``check`` (it reads Redis) until it is true; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up after {timeout_s:g}s waiting for {what}")
        await anyio.sleep(0.05)


async def main(url: str) -> int:
    redis = Redis.from_url(url)
    service = f"dlq-{uuid.uuid4().hex[:8]}"
    stream = f"{service}:invoices"
    print(f"service {service}")
    cli = f"streamjobs dlq {{}} --service {service}"
    consumer = Invoices(redis, service=service, config=ConsumerConfig(finished_stream_ttl_s=0))
    letters = DeadLetters(redis, service=service)
    producer = Producer(redis, service=service)

    async def first_run_done() -> bool:
        return len(consumer.handled) == 3 and await letters.length() == 2

    async def replays_handled() -> bool:
        return len(consumer.handled) == len(INVOICES)

    try:
        async with consumer:
            print("1. invoices arrive; the handler has a bug")
            await producer.add_stream(stream)
            for invoice, currency in INVOICES:
                await producer.append(stream, {"invoice": invoice, "currency": currency})
            await until("3 handled, 2 dead-lettered", first_run_done)

            print(f"2. inspect: {await letters.length()} dead letter(s) in {letters.stream}")
            print(f"   $ {cli.format('list')} --reason rejected")
            records = await letters.list(reason=DeadLetterReason.REJECTED)
            for r in records:
                print(f"   {r.id}  {r.fields['invoice']}  {r.rejected}")
            print(f"   $ {cli.format('list')} --reason 'unsupported currency CHF'")
            chf = await letters.list(reason="unsupported currency CHF")
            print(f"   {len(chf)} rejected for that reason")
            print(f"   $ {cli.format('show')} {records[0].id}")
            first = await letters.get(records[0].id)
            assert first is not None
            print(f"   source {first.source_stream} {first.source_id}, owner {first.owner}")
            print(f"   attempts {first.attempts}, fields {dict(first.fields)}")
            print(f"   $ {cli.format('list')} --source-stream {stream} --limit 1")
            oldest = await letters.select(DeadLetterFilter(source_stream=stream, limit=1))
            print(f"   oldest from {stream}: {oldest[0].fields['invoice']}")

            print("3. fix the handler, replay, close the stream")
            consumer.currencies.add("CHF")
            selection = DeadLetterFilter(reason="rejected", source_stream=stream)
            print(f"   $ {cli.format('replay')} --reason rejected --dry-run")
            dry = await letters.replay(selection, dry_run=True)
            print(f"   would replay {len(dry.replayed)}; nothing changed yet")
            print(f"   $ {cli.format('replay')} --reason rejected")
            report = await letters.replay(selection)
            for done in report.replayed:
                print(f"   {done.dead_letter_id} -> {done.target} {done.new_id}")
            await until("the replayed invoices handled", replays_handled)
            await producer.close_stream(stream)
            with anyio.fail_after(20):
                await consumer.ended.wait()
            left = await letters.length()
    finally:
        if keys := [k async for k in redis.scan_iter(match=f"*{service}*")]:
            await redis.delete(*keys)
        await redis.aclose()
    expected = ["inv-1", "inv-3", "inv-5", "inv-2", "inv-4"]
    if consumer.handled != expected or len(report.replayed) != 2 or left != 0:
        print(f"FAILED: handled {consumer.handled}, replayed {len(report.replayed)}, left {left}")
        return 1
    print(f"done: 2 dead-lettered, {len(report.replayed)} replayed and handled, {left} left")
    return 0


if __name__ == "__main__":
    with redis_for_script(__doc__.splitlines()[0]) as url:
        code = anyio.run(main, url)
    sys.exit(code)
