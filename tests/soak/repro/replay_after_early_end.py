"""Repro of a ``foreign`` entry (and ``past_end``): after a job ended early, a replay of
one of its dead entries drops the ended-job marker, so what the job's producer appends
afterwards is read by the next job of the name.

Job 1 of stream ``s`` gets an entry its handler rejects (``DeadLetter``) and a plain
one; then it is cancelled: the stream's ended-job marker now says that whatever is
appended to ``s`` belongs to job 1, until the next ``add_stream(s)``. The dead letter
is replayed: the replay skips job 1's leftovers, places the copy with an end marker
and queues a run of job 1 (its info), which handles the copy and ends normally. The
ended-job marker is gone. Job 1's producer, which does not know the job ended, appends
one more entry (``job=1``). Then job 2 starts (``add_stream`` after job 1's end) and its
owner hands that entry of job 1 to ``handle()`` with job 2's info. Expected: it is
skipped, like any entry appended after job 1's early end and before the next job.

    .venv/bin/python -m tests.soak.repro.replay_after_early_end

Prints every ``handle()`` call as (entry id, the entry's job, ``info["job"]``,
``replayed_from``) and ends with ``FOREIGN`` or ``OK``; exit status 1 or 0.
"""

from __future__ import annotations

import sys

from redis.asyncio import Redis

from streamjobs import ConsumerConfig, DeadLetterFilter, DeadLetters, Producer
from streamjobs._keys import Keys

from .replay_into_later_job import REASON, SERVICE, STREAM, Recorder, no_foreign, run, until


async def scenario(url: str) -> bool:
    keys = Keys(SERVICE)
    client = Redis.from_url(url)
    producer = Producer(client, service=SERVICE)
    dead = DeadLetters(client, service=SERVICE)
    consumer = Recorder(
        client, service=SERVICE, config=ConsumerConfig(lock_ttl_s=2.0, read_block_ms=100)
    )

    async def idle() -> bool:  # no job of the name queued or running
        queued = await client.hexists(keys.active, STREAM)
        return not queued and not await client.exists(keys.lock(STREAM))

    async with consumer:
        await producer.add_stream(STREAM, {"job": 1})
        await producer.append(STREAM, {"job": "1", "reject": "1"})
        await producer.append(STREAM, {"job": "1"})

        async def both_seen() -> bool:
            return bool(await dead.length()) and any(c[1] == "1" for c in consumer.calls)

        await until("job 1's two entries (one dead-lettered)", both_seen)
        print(f"cancel job 1: {(await producer.cancel_stream(STREAM)).name}")
        await until("job 1 to end", idle)
        print(f"ended-job marker after the cancel: {await client.get(keys.ended(STREAM))!r}")
        report = await dead.replay(DeadLetterFilter(reason=REASON))
        print(f"replayed: {[(r.new_id, r.reassigned) for r in report.replayed]}")

        async def copy_done() -> bool:
            return any(c[3] for c in consumer.calls) and await idle()

        await until("the replayed copy's run of job 1 to end", copy_done)
        print(f"ended-job marker after the replay: {await client.get(keys.ended(STREAM))!r}")
        await producer.append(STREAM, {"job": "1", "late": "1"})  # job 1's producer, late
        await producer.add_stream(STREAM, {"job": 2})
        await producer.append(STREAM, {"job": "2"})
        await producer.close_stream(STREAM)

        async def job2_done() -> bool:
            return any(c[1] == "2" for c in consumer.calls) and await idle()

        await until("job 2 to end", job2_done)
    await client.aclose()
    return no_foreign(consumer.calls)


def main() -> int:
    return run(scenario)


if __name__ == "__main__":
    sys.exit(main())
