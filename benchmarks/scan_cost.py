"""Scan-cost benchmark: what the reconciliation scan costs Redis per interval when the
pending list is long and every owner is alive.

A private ``redis-server`` gets ``--assignments`` (100,000) assignments, all delivered
to one consumer name and all with a live lease and lock, so the scan finds nothing to do: the
worst case for a scanner that reads the whole list. Then ``--passes`` paced passes run
with the default ``RecoveryConfig`` (one page of ``batch_size`` at a time, until
``scan_budget_s``), each after the previous pass's lease was released, and one
unpaced pass reads the whole list for comparison. Per pass it reports the pages
read, the Redis CPU (``INFO commandstats`` microseconds, summed over every command)
and the wall time.

Run: ``python -m benchmarks.scan_cost [--assignments 100000] [--passes 5]``.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from collections.abc import Sequence
from typing import Any

import anyio
import redis.asyncio

from streamjobs import ClusterMode, ConsumerConfig, NullRecorder, RecoveryConfig
from streamjobs._keys import Keys
from streamjobs._recovery import Recoverer
from streamjobs._recovery_loops import RecoveryLoops
from streamjobs._redis import Gateway
from streamjobs._wire import build_fields
from streamjobs.testing import RedisServer

CHUNK = 5000


async def _server_usec(client: Any) -> int:
    stats = await client.info("commandstats")
    return sum(int(v["usec"]) for k, v in stats.items() if k.startswith("cmdstat_"))


def _loops(client: Any, gw: Gateway, service: str, budget_s: float | None) -> RecoveryLoops:
    metrics = NullRecorder()
    recovery = RecoveryConfig(min_idle_s=0.001)
    if budget_s is not None:
        recovery = RecoveryConfig(min_idle_s=0.001, scan_budget_s=budget_s)
    return RecoveryLoops(
        client,
        gw,
        Recoverer(gw, max_retries=3, metrics=metrics, service=service),
        recovery=recovery,
        consumer=ConsumerConfig(),
        cluster_mode=ClusterMode.PROXY,
        metrics=metrics,
        name="bench",
    )


async def _pass(client: Any, keys: Keys, loops: RecoveryLoops) -> tuple[int, int, float]:
    await client.delete(keys.scan_lease)
    before = await _server_usec(client)
    t0 = time.perf_counter()
    pages = await loops.scan_pass()
    wall = time.perf_counter() - t0
    return pages or 0, await _server_usec(client) - before, wall


async def run(assignments: int, passes: int) -> None:
    server = RedisServer().start()
    client: Any = redis.asyncio.Redis.from_url(server.url)
    try:
        service = f"scan-{uuid.uuid4().hex[:8]}"
        keys = Keys(service)
        gw = Gateway(client, keys)
        await gw.assignments.ensure_group()
        for start in range(0, assignments, CHUNK):
            async with client.pipeline(transaction=False) as pipe:
                for i in range(start, min(assignments, start + CHUNK)):
                    pipe.xadd(keys.assignments, build_fields(f"d:{service}:{i}", {}))
                await pipe.execute()
        ids: list[str] = []
        while len(ids) < assignments:
            reply = await client.xreadgroup(service, "owner", {keys.assignments: ">"}, count=CHUNK)
            ids += [i.decode() for i, _ in reply[0][1]]
        for start in range(0, assignments, CHUNK):
            await gw.streams.record_leases(ids[start : start + CHUNK], 3_600_000, new=True)
            # Alive means a lock too: a lease this far ahead is a session-mode one, and
            # the scan asks the lock about it (docs/design.md#recovery).
            async with client.pipeline(transaction=False) as pipe:
                for i in range(start, min(assignments, start + CHUNK)):
                    pipe.set(keys.lock(f"d:{service}:{i}"), "owner:1", px=3_600_000)
                await pipe.execute()
        await anyio.sleep(0.01)  # XPENDING IDLE counts whole milliseconds
        print(f"{assignments:,} pending assignments, every owner alive")
        print("| pass | pages | entries | Redis CPU ms | wall ms |")
        print("|---|---|---|---|---|")
        paced = _loops(client, gw, service, None)
        for n in range(1, passes + 1):
            pages, usec, wall = await _pass(client, keys, paced)
            print(
                f"| paced {n} | {pages} | {pages * 100:,} | {usec / 1000:.1f} | {wall * 1000:.0f} |"
            )
        await gw.liveness.save_scan_cursor("-")
        whole = _loops(client, gw, service, 3600.0)
        pages, usec, wall = await _pass(client, keys, whole)
        row = f"| unpaced, whole list | {pages} | {assignments:,} | {usec / 1000:.1f} |"
        print(f"{row} {wall * 1000:.0f} |")
    finally:
        await client.aclose()
        server.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scan_cost")
    parser.add_argument("--assignments", type=int, default=100_000)
    parser.add_argument("--passes", type=int, default=5)
    ns = parser.parse_args(argv)
    anyio.run(run, ns.assignments, ns.passes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
