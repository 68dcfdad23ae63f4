"""Three GroupConsumers share one stream of emails; one stops mid-work; a dead letter is replayed.

    python examples/shared_group/mailer.py [REDIS_URL]

What it does, in one process:

1. starts three ``Mailer`` consumers (``GroupConsumer``) of one service on one stream,
   ``<service>:emails``, and appends 40 emails to it with a plain ``XADD``: each email
   is sent by exactly one of them;
2. stops the consumer ``m3`` while it holds emails it has read and not sent yet: its
   stop marks it stopped, and the other two take those emails at their next reclaim
   pass, without waiting for a session TTL (10 s here);
3. an email without an ``@`` is dead-lettered (``DeadLetter``); once the "fix" is in,
   ``DeadLetters.replay`` appends it to the stream again and a consumer sends it;
4. prints the group as ``Inspector.groups()`` (``streamjobs status``) shows it.

As a worker, the same class reads whatever ``--stream`` names::

    streamjobs worker examples.shared_group.mailer:Mailer --service mailer --stream emails

Exit code 0 if every email was sent exactly once and nothing is left pending.
"""

from __future__ import annotations

import inspect
import sys
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import anyio
from redis.asyncio import Redis

from streamjobs import ConsumerConfig, DeadLetter, DeadLetters, GroupConsumer, Inspector, Message
from streamjobs.testing import redis_for_script

EMAILS = 40


class Mailer(GroupConsumer):
    streams = ["emails"]  # replaced by streams=[...] below, or by --stream

    def __init__(self, redis: Any, **kwargs: Any) -> None:
        super().__init__(redis, **kwargs)
        self.sent: list[str] = []
        self.accept_local = False  # the "fix" for addresses without a domain

    async def handle(self, message: Message) -> None:
        to = message.fields["to"]
        if "@" not in to and not self.accept_local:
            raise DeadLetter(reason=f"not an email address: {to!r}")
        await anyio.sleep(0.05)  # the SMTP round trip
        self.sent.append(message.replayed_from or message.id)


async def until(condition: Callable[[], object]) -> None:
    """Poll ``condition`` (its value, awaited if it is awaitable) until it is true."""
    with anyio.fail_after(20):
        while True:
            value = condition()
            if inspect.isawaitable(value):
                value = await value
            if value:
                return
            await anyio.sleep(0.02)


async def main(url: str) -> int:
    redis = Redis.from_url(url)
    service = f"mailer-{uuid.uuid4().hex[:8]}"
    stream = f"{service}:emails"
    print(f"service {service}")
    print(f"stream {stream}")
    config = ConsumerConfig(lock_ttl_s=10, read_batch_size=5, shutdown_grace_s=1)
    mailers = [
        Mailer(redis, service=service, streams=[stream], config=config, consumer_name=f"m{i}")
        for i in (1, 2, 3)
    ]
    try:
        async with anyio.create_task_group() as tg:
            for mailer in mailers:
                await tg.start(mailer.run)
            for i in range(EMAILS):  # any producer: a plain XADD
                await redis.xadd(stream, {"to": f"user{i}@example.com"})
            bad = (await redis.xadd(stream, {"to": "postmaster"})).decode()  # type: ignore[union-attr]

            await until(lambda: len(mailers[2].sent) >= 2)
            await mailers[2].aclose()  # stops with emails read and not sent: handed on
            print(f"m3 stopped after sending {len(mailers[2].sent)}")

            letters = DeadLetters(redis, service=service)
            await until(lambda: sum(len(m.sent) for m in mailers) >= EMAILS)
            await until(lambda: letters.length())
            (letter,) = await letters.list()
            print(f"dead letter: {letter.source_id} from {letter.source_stream}: {letter.error}")
            for mailer in mailers:
                mailer.accept_local = True
            await letters.replay([letter.id])
            await until(lambda: bad in {i for m in mailers for i in m.sent})

            for group in await Inspector(redis, service=service).groups():
                print(f"group on {group.stream}: pending {group.pending}, lag {group.lag}")
                for member in group.members:
                    print(f"  {member.member:<14} {member.state:<8} pending {member.pending}")
            for mailer in mailers[:2]:
                await mailer.aclose()
        pending = int((await redis.xpending(stream, service))["pending"])
    finally:
        if keys := [k async for k in redis.scan_iter(match=f"*{service}*")]:
            await redis.delete(*keys)
        await redis.aclose()
    sent = Counter(i for m in mailers for i in m.sent)
    for m in mailers:
        print(f"{m.consumer_name} sent {len(m.sent)}")
    twice = [i for i, n in sent.items() if n > 1]
    if len(sent) != EMAILS + 1 or twice or pending:
        print(f"FAILED: {len(sent)} sent, twice {twice}, {pending} pending")
        return 1
    print(f"done: {len(sent)} sent once each by 3 consumers, 1 replayed, 0 pending")
    return 0


if __name__ == "__main__":
    with redis_for_script(__doc__.splitlines()[0]) as url:
        code = anyio.run(main, url)
    sys.exit(code)
