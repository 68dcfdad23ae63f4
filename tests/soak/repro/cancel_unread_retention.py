"""Repro of ``left_behind_data``: a job cancelled before any consumer read its assignment
leaves its data stream without the retention TTL.

``add_stream`` clears the retention of the stream (a new job must not expire), some
entries are appended, then ``cancel_stream`` finds the assignment still queued and
removes it (``REMOVED``). No owner ever seals that job, and the seal is what applies
``finished_stream_ttl_s``: the stream, with its entries, stays in Redis for good
(unless a later job of the same name comes and ends). Every other way a job ends
leaves the stream expiring.

    .venv/bin/python -m tests.soak.repro.cancel_unread_retention

Prints the outcome and the stream's PTTL (-1: no TTL) and exits 1 when it has none.
"""

from __future__ import annotations

import sys

import anyio
from redis.asyncio import Redis

from streamjobs import Producer
from streamjobs.testing import RedisServer

SERVICE = "repro"
STREAM = "s"


async def scenario(url: str) -> bool:
    client = Redis.from_url(url)
    producer = Producer(client, service=SERVICE)
    await producer.add_stream(STREAM, {"job": 1})
    await producer.append(STREAM, {"n": "1"})
    outcome = await producer.cancel_stream(STREAM)
    pttl = int(await client.pttl(STREAM))
    await client.aclose()
    print(f"cancel_stream: {outcome.name}; the stream's PTTL: {pttl} ms")
    if pttl == -1:
        print("LEAK: the cancelled job's stream never expires")
        return False
    print("OK: the stream carries a retention TTL")
    return True


def main() -> int:
    with RedisServer() as server:
        return 0 if anyio.run(scenario, server.url) else 1


if __name__ == "__main__":
    sys.exit(main())
