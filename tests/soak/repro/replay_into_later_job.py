"""Repro of a ``foreign`` entry: a dead entry replayed while a later job of its stream's
name is open is handed to that later job.

Job 1 of stream ``s`` (``info={"job": 1}``) has one entry, which its handler rejects
(``DeadLetter``), and its end marker: job 1 finishes. Job 2 of the same name starts
(``add_stream`` once job 1 finished: a new job) and is open, its first entry handled.
Now the dead letter of job 1's entry is replayed. The stream is open and a job holds
it, so the replay appends the entry at the stream's tail, and job 2's owner hands it to
``handle()`` with job 2's info: an entry of job 1 processed as job 2's (the soak counts
it as a foreign entry). Expected: it is handled under job 1's info (a job of its own,
as a replay of an entry of a finished job does when the name is free). Fixed: the
replay is refused ("a later job ... is running") until job 2 has ended, then runs as
a job of its own with job 1's info.

    .venv/bin/python -m tests.soak.repro.replay_into_later_job

Prints every ``handle()`` call as (entry id, the entry's job, ``info["job"]``,
``replayed_from``) and ends with ``FOREIGN`` or ``OK``; exit status 1 or 0.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Awaitable, Callable

import anyio
from redis.asyncio import Redis

from streamjobs import (
    ConsumerConfig,
    DeadLetter,
    DeadLetterFilter,
    DeadLetters,
    Message,
    Producer,
    StreamConsumer,
)
from streamjobs._keys import Keys
from streamjobs.testing import RedisServer

SERVICE = "repro"
STREAM = "s"
REASON = "repro reject"


class Recorder(StreamConsumer):
    calls: list[tuple[str, str, str, str]] = []

    async def handle(self, message: Message) -> None:
        if message.fields.get("reject") == "1" and not message.replayed_from:
            raise DeadLetter(REASON)
        call = (
            message.id,
            message.fields.get("job", ""),
            str(message.info.get("job", "")),
            message.replayed_from or "",
        )
        print(
            f"handle: entry {call[0]} of job {call[1]}, info job {call[2]}, replayed from "
            f"{call[3] or '-'}"
        )
        self.calls.append(call)


async def until(what: str, check: Callable[[], Awaitable[bool]], timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await anyio.sleep(0.02)


async def scenario(url: str) -> bool:
    keys = Keys(SERVICE)
    client = Redis.from_url(url)
    producer = Producer(client, service=SERVICE)
    dead = DeadLetters(client, service=SERVICE)
    consumer = Recorder(
        client, service=SERVICE, config=ConsumerConfig(lock_ttl_s=2.0, read_block_ms=100)
    )
    async with consumer:
        await producer.add_stream(STREAM, {"job": 1})
        await producer.append(STREAM, {"job": "1", "reject": "1"})
        await producer.close_stream(STREAM)

        async def job1_done() -> bool:
            idle = not await client.hexists(keys.active, STREAM)
            return idle and not await client.exists(keys.lock(STREAM)) and bool(await dead.length())

        await until("job 1 to finish with one dead letter", job1_done)
        print("job 1 finished; its entry is in the dead-letter stream")
        await producer.add_stream(STREAM, {"job": 2})
        await producer.append(STREAM, {"job": "2"})

        async def job2_running() -> bool:
            return any(c[1] == "2" for c in consumer.calls)

        await until("job 2's first entry", job2_running)
        report = await dead.replay(DeadLetterFilter(reason=REASON))
        print(f"replayed: {[(r.new_id, r.reassigned) for r in report.replayed]}")
        print(f"skipped: {report.skipped}")
        if not report.replayed:
            # Refused while job 2 runs (fixed behaviour): replay once job 2 has ended.
            await producer.close_stream(STREAM)

            async def job2_done() -> bool:
                idle = not await client.hexists(keys.active, STREAM)
                return idle and not await client.exists(keys.lock(STREAM))

            await until("job 2 to finish", job2_done)
            report = await dead.replay(DeadLetterFilter(reason=REASON))
            print(f"replayed after job 2: {[(r.new_id, r.reassigned) for r in report.replayed]}")

        async def copy_handled() -> bool:
            return any(c[3] for c in consumer.calls)

        await until("the replayed copy to be handled", copy_handled)
        await producer.close_stream(STREAM)
    await client.aclose()
    return no_foreign(consumer.calls)


def no_foreign(calls: list[tuple[str, str, str, str]]) -> bool:
    """Print each call handed to a job it did not belong to; True if there was none."""
    foreign = [c for c in calls if c[1] != c[2]]
    for entry_id, job, info_job, origin in foreign:
        print(
            f"FOREIGN: entry {entry_id} (job {job}, replayed from {origin or '-'}) was handed "
            f"to job {info_job}"
        )
    if not foreign:
        print("OK: every entry was handled under its own job")
    return not foreign


def run(scenario: Callable[[str], Awaitable[bool]]) -> int:
    """Exit status of ``scenario`` run against a private server: 0 if it held."""
    with RedisServer() as server:
        return 0 if anyio.run(scenario, server.url) else 1


def main() -> int:
    return run(scenario)


if __name__ == "__main__":
    sys.exit(main())
