"""Status-cost benchmark: how long ``Inspector.overview()`` (what ``streamjobs
status`` prints) takes, and what it costs Redis, for a service with many owned
streams.

A private ``redis-server`` gets ``--streams`` (10,000) data streams, each with a few
entries, its group, an assignment delivered to one of ``--consumers`` (4) consumer
names, a lock held by that consumer and a lease; plus ``--dead`` (1,000) dead letters.
Then ``overview()`` runs ``--rounds`` (3) times. Reported per round: wall time, Redis
CPU (``INFO commandstats`` microseconds, every command) and commands sent.

Run: ``python -m benchmarks.status_cost [--streams 10000] [--rounds 3]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from collections.abc import Sequence
from typing import Any

import anyio
import redis.asyncio

from streamjobs import Inspector
from streamjobs._keys import Keys
from streamjobs._redis import Gateway
from streamjobs._wire import build_fields
from streamjobs.testing import RedisServer

CHUNK = 2000


async def _stats(client: Any) -> tuple[int, int]:
    """(microseconds, calls) summed over every command."""
    stats = await client.info("commandstats")
    rows = [v for k, v in stats.items() if k.startswith("cmdstat_")]
    return sum(int(v["usec"]) for v in rows), sum(int(v["calls"]) for v in rows)


async def _populate(client: Any, keys: Keys, streams: int, consumers: int, dead: int) -> None:
    gw = Gateway(client, keys)
    await gw.assignments.ensure_group()
    names = [f"d:{keys.service}:{i}" for i in range(streams)]
    for start in range(0, streams, CHUNK):
        async with client.pipeline(transaction=False) as pipe:
            for name in names[start : start + CHUNK]:
                pipe.xadd(keys.assignments, build_fields(name, {}))
                for n in range(3):
                    pipe.xadd(name, {"n": str(n)})
                pipe.xgroup_create(name, keys.group, id="0")
            await pipe.execute()
    owners = [f"consumer-{c}" for c in range(consumers)]
    delivered: list[tuple[str, str]] = []
    turn = 0
    while len(delivered) < streams:
        owner = owners[turn % consumers]
        turn += 1
        reply = await client.xreadgroup(keys.group, owner, {keys.assignments: ">"}, count=CHUNK)
        delivered += [(i.decode(), owner) for i, _ in reply[0][1]]
    for start in range(0, streams, CHUNK):
        async with client.pipeline(transaction=False) as pipe:
            for name, (_, owner) in zip(
                names[start : start + CHUNK], delivered[start:], strict=False
            ):
                pipe.set(keys.lock(name), f"{owner}:abc", px=3_600_000)
                pipe.xreadgroup(keys.group, owner, {name: ">"}, count=1)
            await pipe.execute()
        await gw.streams.record_leases(
            [i for i, _ in delivered[start : start + CHUNK]], 3_600_000, new=True
        )
    for owner in owners:
        await gw.liveness.touch_session(owner, "{}", 3_600_000)
    async with client.pipeline(transaction=False) as pipe:
        for i in range(dead):
            pipe.xadd(keys.dead_letters, {"n": str(i), "_dlq_reason": "handler_failed"})
        await pipe.execute()


async def run(streams: int, consumers: int, dead: int, rounds: int) -> list[float]:
    server = RedisServer().start()
    client: Any = redis.asyncio.Redis.from_url(server.url)
    walls: list[float] = []
    try:
        keys = Keys(f"status-{uuid.uuid4().hex[:8]}")
        t0 = time.perf_counter()
        await _populate(client, keys, streams, consumers, dead)
        print(
            f"{streams:,} owned streams over {consumers} consumers, {dead:,} dead letters "
            f"(set up in {time.perf_counter() - t0:.1f}s)"
        )
        print("| round | wall ms | Redis CPU ms | commands |")
        print("|---|---|---|---|")
        inspector = Inspector(client, service=keys.service)
        for n in range(1, rounds + 1):
            usec0, calls0 = await _stats(client)
            t0 = time.perf_counter()
            view = await inspector.overview()
            wall = time.perf_counter() - t0
            usec1, calls1 = await _stats(client)
            if len(view.streams) != streams or view.dlq.length != dead:
                raise RuntimeError(
                    f"overview saw {len(view.streams)} streams, {view.dlq.length} dead"
                )
            walls.append(wall)
            # The INFO call that read the counters counts itself once.
            cpu_ms, calls = (usec1 - usec0) / 1000, calls1 - calls0 - 1
            print(f"| {n} | {wall * 1000:.0f} | {cpu_ms:.1f} | {calls:,} |")
        print(f"median wall: {statistics.median(walls) * 1000:.0f} ms")
    finally:
        await client.aclose()
        server.stop()
    return walls


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.status_cost")
    parser.add_argument("--streams", type=int, default=10_000)
    parser.add_argument("--consumers", type=int, default=4)
    parser.add_argument("--dead", type=int, default=1_000)
    parser.add_argument("--rounds", type=int, default=3)
    ns = parser.parse_args(argv)
    anyio.run(run, ns.streams, ns.consumers, ns.dead, ns.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
