"""Many-streams benchmark: many short streams, two consumer processes.

``--streams`` (2,000) data streams of ``--entries`` (10) entries each, drained by two
processes, against a bare redis-py loop over the same data in two processes. Rounds
alternate the contenders, each on fresh keys of one private ``redis-server``:

* ``bare``: each process takes half of the streams and, per stream, one
  ``XREADGROUP COUNT 100`` and one ``XACK`` of what it read, pipelined with the next
  stream's read (a no-op ``async`` handler per entry). No ownership, no recovery.
* ``streamjobs``: two ``streamjobs worker`` processes (``--concurrency 50``, no-op
  handler) take the assignments; each stream ends with the end marker.

Both sides start their processes first and are timed from the moment work is released
(a ``go`` key for bare, the assignments for streamjobs) until every stream is done
(every entry acked, every assignment finished). Counts are checked: a contender that
misses an entry fails the run.

Run: ``python -m benchmarks.many_streams [--streams 2000] [--entries 10] [--rounds 3]``.

``--cluster`` runs the same rounds on a private OSS Redis Cluster of 3 primaries and 3
replicas (``streamjobs.testing.LocalCluster``, imported only then), started for the
run and stopped at the end, also on an error, Ctrl-C or SIGTERM. The streams spread
over the three primaries by hash slot. The bare processes use
``redis.asyncio.cluster.RedisCluster``: one stream's ``XACK`` and the next stream's
``XREADGROUP`` are in different slots (on different primaries two times in three), so
the cluster pipeline (``transaction=False``) splits them into one batch per primary,
sent concurrently: still one round trip of wall time per stream, but up to two
connections written to. Each ``XREADGROUP`` goes to its stream's primary explicitly
(see ``benchmarks.hot_stream.xreadgroup``: otherwise redis-py asks ``COMMAND GETKEYS``
twice per read). The ``streamjobs worker`` processes run with ``--cluster``
(``ClusterMode.OSS``). Setup (producing, the work lists, releasing work, deleting keys
with SCAN on every primary) goes through ``redis.cluster.RedisCluster``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import redis

from benchmarks.hot_stream import sigterm_exits, xreadgroup
from streamjobs import Message, StreamConsumer
from streamjobs._wire import EOS_FIELD, EOS_VALUE, build_fields
from streamjobs.testing import RedisServer, WorkerFleet

ROOT = Path(__file__).resolve().parents[1]
PROCESSES = 2
CONCURRENCY = 50
CHUNK = 2000


class BenchmarkError(RuntimeError):
    """A contender did not handle exactly the expected entries."""


class Sink(StreamConsumer):
    """The streamjobs contender's consumer: a no-op handler."""

    async def handle(self, message: Message) -> None:
        return None


def _produce(r: Any, names: Sequence[str], entries: int) -> None:
    for start in range(0, len(names), CHUNK // max(1, entries)):
        pipe = r.pipeline(transaction=False)
        for name in names[start : start + CHUNK // max(1, entries)]:
            for i in range(entries):
                pipe.xadd(name, {"n": str(i), "payload": "x" * 100})
            pipe.xadd(name, {EOS_FIELD: EOS_VALUE})
        pipe.execute()


# -- bare ---------------------------------------------------------------------------------


def bare_worker(url: str, run: str, index: int, cluster: bool = False) -> None:
    """One bare process: wait for ``go``, drain its half of the streams, report.

    On a cluster the pipeline of one stream's ``XACK`` and the next stream's
    ``XREADGROUP`` spans two slots, usually two primaries: redis-py's cluster pipeline
    (``transaction=False``) sends one batch per primary, concurrently, and returns the
    replies in order. The read names its stream's primary (no ``COMMAND GETKEYS``).
    """
    import anyio
    import redis.asyncio
    from redis.asyncio.cluster import RedisCluster

    async def main() -> None:
        client: Any = RedisCluster.from_url(url) if cluster else redis.asyncio.Redis.from_url(url)
        names = [n.decode() for n in await client.lrange(f"{run}:names:{index}", 0, -1)]
        for name in names:
            await client.xgroup_create(name, "g", id="0")
        await client.rpush(f"{run}:ready", index)
        await client.blpop([f"{run}:go:{index}"])

        async def noop(entry_id: bytes, fields: dict[bytes, bytes]) -> None:
            return None

        handled = 0
        pending_ack: tuple[str, list[bytes]] | None = None
        for name in names:
            pipe = client.pipeline(transaction=False)
            if pending_ack is not None:
                pipe.xack(pending_ack[0], "g", *pending_ack[1])
            node = client.get_node_from_key(name) if cluster else None
            xreadgroup(pipe, node, "g", "c", name, 100)
            replies = await pipe.execute()
            batch = replies[-1][0][1] if replies[-1] else []
            for entry_id, fields in batch:
                if fields.get(EOS_FIELD.encode()) != EOS_VALUE.encode():
                    await noop(entry_id, fields)
                    handled += 1
            pending_ack = (name, [i for i, _ in batch])
        if pending_ack is not None and pending_ack[1]:
            await client.xack(pending_ack[0], "g", *pending_ack[1])
        await client.rpush(f"{run}:done", handled)
        await client.aclose()

    anyio.run(main)


def run_bare(r: Any, url: str, streams: int, entries: int, cluster: bool = False) -> float:
    run = f"bench-bare-{uuid.uuid4().hex[:8]}"
    names = [f"{run}:s:{i}" for i in range(streams)]
    _produce(r, names, entries)
    halves = [names[i::PROCESSES] for i in range(PROCESSES)]
    for i, half in enumerate(halves):
        r.rpush(f"{run}:names:{i}", *half)
    mode = "cluster" if cluster else "standalone"
    command = [sys.executable, "-m", "benchmarks.many_streams", "--bare-worker", url, run]
    procs = [subprocess.Popen([*command, str(i), mode], cwd=ROOT) for i in range(PROCESSES)]
    failed = True
    try:
        while r.llen(f"{run}:ready") < PROCESSES:
            r.blpop([f"{run}:never"], timeout=0.01)  # a short, server-side wait
        t0 = time.perf_counter()
        for i in range(PROCESSES):
            r.rpush(f"{run}:go:{i}", 1)
        handled = 0
        for _ in range(PROCESSES):
            reply = r.blpop([f"{run}:done"], timeout=300)
            if reply is None:
                raise BenchmarkError("bare: a process did not finish within 300 s")
            handled += int(reply[1])
        elapsed = time.perf_counter() - t0
        failed = False
    finally:
        for p in procs:
            if failed:
                p.kill()  # it may wait for a go that never comes
            p.wait(timeout=60)
        _delete(r, run)
    if handled != streams * entries:
        raise BenchmarkError(f"bare: handled {handled} of {streams * entries} entries")
    return elapsed


# -- streamjobs -----------------------------------------------------------------------------


def run_streamjobs(r: Any, url: str, streams: int, entries: int, cluster: bool = False) -> float:
    service = f"bench-sj-{uuid.uuid4().hex[:8]}"
    names = [f"{service}:s:{i}" for i in range(streams)]
    _produce(r, names, entries)
    lbs = f"streamjobs:{{{service}}}:lbs"
    args = ["--concurrency", str(CONCURRENCY), "--block-ms", "100"]
    if cluster:
        args.append("--cluster")
    with WorkerFleet(
        url, service, "benchmarks.many_streams:Sink", args, pythonpath=[ROOT], cwd=ROOT
    ) as fleet:
        for i in range(PROCESSES):
            fleet.start(f"w{i}")
        fleet.wait_started(timeout_s=60)
        t0 = time.perf_counter()
        for start in range(0, streams, CHUNK):
            pipe = r.pipeline(transaction=False)
            for name in names[start : start + CHUNK]:
                pipe.xadd(lbs, dict(build_fields(name, {})))
            pipe.execute()
        deadline = time.monotonic() + 600
        while r.xlen(lbs) or r.xpending(lbs, service)["pending"]:
            if time.monotonic() > deadline:
                raise BenchmarkError("streamjobs: streams not finished within 600 s")
            r.blpop([f"{service}:never"], timeout=0.01)
        elapsed = time.perf_counter() - t0
    acked = sum(1 for n in names if r.exists(n) and r.xpending(n, service)["pending"])
    _delete(r, service)
    if acked:
        raise BenchmarkError(f"streamjobs: {acked} streams still have pending entries")
    return elapsed


def _delete(r: Any, fragment: str) -> None:
    """SCAN (on a cluster: every primary) + DEL of every key containing ``fragment``."""
    for key in r.scan_iter(match=f"*{fragment}*", count=1000):
        r.delete(key)


# -- the run --------------------------------------------------------------------------------


@contextlib.contextmanager
def _private_redis(cluster: bool) -> Iterator[tuple[str, Any]]:
    """(URL, sync client) of a private ``redis-server``, or with ``cluster`` of a private
    3-primary + 3-replica cluster (a ``redis.cluster.RedisCluster``); stopped after."""
    if not cluster:
        server = RedisServer(dir_prefix="streamjobs-bench-").start()
        try:
            with redis.Redis.from_url(server.url) as r:
                yield server.url, r
        finally:
            server.stop()
        return
    from redis.cluster import RedisCluster

    from streamjobs.testing import LocalCluster

    with LocalCluster() as local, RedisCluster.from_url(local.url) as rc:
        yield local.url, rc


def run(streams: int, entries: int, rounds: int, cluster: bool = False) -> float:
    """Median ratio streamjobs/bare (entries per second); prints a table."""
    ratios: list[float] = []
    total = streams * entries
    with _private_redis(cluster) as (url, r):
        print(f"{streams:,} streams x {entries} entries, {PROCESSES} processes each side")
        if cluster:
            primaries = len(r.get_primaries())
            print(f"## many streams on the cluster ({primaries} primaries)")
        print("| round | bare entries/s | streamjobs entries/s | ratio streamjobs/bare |")
        print("|---|---|---|---|")
        for n in range(1, rounds + 1):
            if n % 2:
                bare = run_bare(r, url, streams, entries, cluster)
                sj = run_streamjobs(r, url, streams, entries, cluster)
            else:
                sj = run_streamjobs(r, url, streams, entries, cluster)
                bare = run_bare(r, url, streams, entries, cluster)
            ratios.append(bare / sj)
            print(f"| {n} | {total / bare:,.0f} | {total / sj:,.0f} | {bare / sj:.3f} |")
    median = statistics.median(ratios)
    print(f"median ratio streamjobs/bare: {median:.3f}")
    return median


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--bare-worker"]:
        bare_worker(args[1], args[2], int(args[3]), cluster=args[4:5] == ["cluster"])
        return 0
    parser = argparse.ArgumentParser(prog="python -m benchmarks.many_streams")
    parser.add_argument("--streams", type=int, default=2000)
    parser.add_argument("--entries", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="run on a private 3-primary + 3-replica OSS Redis Cluster started for the run",
    )
    ns = parser.parse_args(args)
    os.environ.setdefault("PYTHONPATH", str(ROOT))
    with sigterm_exits():
        run(ns.streams, ns.entries, ns.rounds, ns.cluster)
    return 0


if __name__ == "__main__":
    sys.exit(main())
