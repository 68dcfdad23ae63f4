"""Shared-group benchmark: ``GroupConsumer`` against a bare redis-py loop on one stream.

Part 1, one process. Two contenders drain the same workload (N entries of ~100 bytes,
produced in advance with pipelined XADDs, not timed), alternated within one run, each
round on fresh keys:

* ``bare``: :func:`benchmarks.hot_stream.run_bare`: ``XREADGROUP COUNT batch``, a no-op
  ``async`` handler per entry, one ``XACK`` of the batch pipelined with the next read;
* ``streamjobs``: a :class:`~streamjobs.GroupConsumer` with a no-op handler reading the
  stream in its group (created at ``0``), timed from ``async with consumer`` until its
  handler has counted N entries, then stopped; nothing may be left pending.

Part 2, N processes (``--processes 1,2,4``): N ``streamjobs worker`` processes of
:class:`NoopGroup` share one stream. Its entries are produced first, behind the
group's position (``$``); the workers start and join (not timed); then the group is
moved back to ``0`` (``XGROUP SETID``) and one more entry wakes them, and the time
runs from that move until the group has delivered and acknowledged every entry (lag
and pending both 0, polled every 10 ms). On a 2-core machine the workers and Redis
share the cores.

Run: ``python -m benchmarks.shared_group [--entries N] [--rounds 3] [--batch 100]
[--processes 1,2,4] [--process-entries N]``. A private ``redis-server`` is started and
stopped at the end; only keys holding this run's id are written and deleted.
"""

from __future__ import annotations

import argparse
import functools
import gc
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio

from benchmarks.hot_stream import (
    BARE,
    STREAMJOBS,
    BenchmarkError,
    Result,
    Round,
    Summary,
    Target,
    _describe,
    _positive_int,
    command_stats,
    connect,
    delete_keys_containing,
    produce,
    redis_target,
    run_bare,
    sigterm_exits,
    start_counting,
    stats_delta,
)
from streamjobs import ConsumerConfig, GroupConsumer, Message
from streamjobs.cli import DEFAULT_URL

ROOT = Path(__file__).resolve().parents[1]


class NoopGroup(GroupConsumer):
    """Counts entries; sets ``done`` once it has seen ``expected`` of them."""

    def __init__(self, *args: Any, expected: int = 0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.count = 0
        self.expected = expected
        self.done = anyio.Event()

    async def handle(self, message: Message) -> None:
        self.count += 1
        if self.count == self.expected:
            self.done.set()


async def run_group(
    client: Any, admin: Any, target: Target, stream: str, service: str, n: int, batch: int
) -> Result:
    await produce(client, stream, n)
    await client.xgroup_create(stream, service, id="0")
    consumer = NoopGroup(
        client,
        service=service,
        streams=[stream],
        expected=n,
        config=ConsumerConfig(read_batch_size=batch, lock_ttl_s=30),
    )
    before = await start_counting(admin, target)
    gc.collect()
    timeout_s = max(60.0, n / 500)
    t0 = time.perf_counter()
    try:
        async with consumer:
            startup = time.perf_counter() - t0
            with anyio.fail_after(timeout_s):
                await consumer.done.wait()
            elapsed = time.perf_counter() - t0
    except TimeoutError:
        raise BenchmarkError(
            f"streamjobs: {consumer.count}/{n} entries after {timeout_s:.0f}s"
        ) from None
    commands, usec = stats_delta(before, await command_stats(admin))
    pending = int((await client.xpending(stream, service))["pending"])
    await client.delete(stream)
    if consumer.count != n or pending:
        raise BenchmarkError(f"streamjobs: handled {consumer.count}/{n}, {pending} pending")
    return Result(STREAMJOBS, consumer.count, elapsed, commands, usec, startup_s=startup)


async def one_process(target: Target, entries: int, rounds: int, batch: int) -> Summary:
    run_id = uuid.uuid4().hex[:12]
    client = connect(target, decode_responses=False)
    admin = connect(target, decode_responses=True)
    done: list[Round] = []
    try:
        print(await _describe(admin, target), flush=True)
        print(f"workload: {entries:,} entries of ~100 B, batch {batch}, run id {run_id}")
        for index in range(rounds):
            order = (BARE, STREAMJOBS) if index % 2 == 0 else (STREAMJOBS, BARE)
            results: dict[str, Result] = {}
            for contender in order:
                stream = f"bench:{run_id}:r{index}:{contender}"
                if contender == BARE:
                    results[contender] = await run_bare(
                        client, admin, target, stream, entries, batch
                    )
                else:
                    service = f"bench-{run_id}-r{index}"
                    results[contender] = await run_group(
                        client, admin, target, stream, service, entries, batch
                    )
            rnd = Round(index, order, results)
            done.append(rnd)
            b, s = results[BARE], results[STREAMJOBS]
            print(
                f"round {index + 1}/{rounds}: bare {b.rate:,.0f}/s | group {s.rate:,.0f}/s "
                f"(startup {s.startup_s * 1000:.0f} ms) | ratio {rnd.ratio:.3f}",
                flush=True,
            )
    finally:
        await delete_keys_containing(admin, run_id)
        await client.aclose()
        await admin.aclose()
    summary = Summary(done, entries, batch)
    sj_cpe, sj_cmds = summary.commands_per_entry(STREAMJOBS)
    total = entries * len(done)
    print()
    print("## shared group, one process")
    print()
    print("| round | bare entries/s | GroupConsumer entries/s | ratio | group cmds/entry |")
    print("|---|---|---|---|---|")
    for r in done:
        b, s = r.results[BARE], r.results[STREAMJOBS]
        print(
            f"| {r.index + 1} | {b.rate:,.0f} | {s.rate:,.0f} | {r.ratio:.3f} | "
            f"{s.commands_total / s.entries:.4f} |"
        )
    print(
        f"| median | {statistics.median(summary.rates(BARE)):,.0f} | "
        f"{statistics.median(summary.rates(STREAMJOBS)):,.0f} | "
        f"{statistics.median(summary.ratios):.3f} (goal >= 0.5) | {sj_cpe:.4f} |"
    )
    top = ", ".join(f"{k} {v / total:.4f}" for k, v in sj_cmds.most_common(6))
    print(f"\ngroup commands/entry by name: {top}")
    return summary


async def n_processes(target: Target, counts: Sequence[int], entries: int, batch: int) -> None:
    run_id = uuid.uuid4().hex[:12]
    admin = connect(target, decode_responses=True)
    rows = []
    try:
        for n in counts:
            service = f"bench-{run_id}-p{n}"
            stream = f"bench:{run_id}:p{n}"
            # The entries are there before the workers start, behind the group's
            # position; once every worker has joined, the group is moved back to 0
            # and one more entry wakes them: the clock runs from that move.
            await produce(admin, stream, entries)
            await admin.xgroup_create(stream, service, id="$")
            logs = Path(tempfile.mkdtemp(prefix="streamjobs-bench-"))
            env = {**os.environ, "STREAMJOBS_REDIS_URL": target.url, "PYTHONPATH": str(ROOT)}
            command = [
                sys.executable, "-m", "streamjobs", "worker", "benchmarks.shared_group:NoopGroup",
                "--service", service, "--stream", stream, "--batch", str(batch),
                "--lock-ttl", "30", "--log-level", "WARNING",
            ]  # fmt: skip
            procs = []
            for i in range(n):
                with (logs / f"w{i}.log").open("wb") as out:  # the worker keeps its own
                    procs.append(
                        await anyio.open_process(
                            [*command, "--consumer-name", f"w{i}"],
                            env=env,
                            cwd=ROOT,
                            stdout=out,
                            stderr=subprocess.STDOUT,
                        )
                    )
            try:
                members = f"streamjobs:members:{service}:{{{stream}}}"
                await until(functools.partial(_joined, admin, members, n), 60)
                t0 = time.perf_counter()
                await admin.xgroup_setid(stream, service, id="0")
                await admin.xadd(stream, {"payload": "wake"})
                drained = functools.partial(_drained, admin, stream, service)
                await until(drained, max(60.0, entries / 500))
                elapsed = time.perf_counter() - t0
            finally:
                for p in procs:
                    p.terminate()
                for p in procs:
                    with anyio.move_on_after(30):
                        await p.wait()
                    await p.aclose()
            shutil.rmtree(logs, ignore_errors=True)
            rows.append((n, (entries + 1) / elapsed, elapsed))
            print(f"{n} process(es): {(entries + 1) / elapsed:,.0f} entries/s ({elapsed:.2f} s)")
    finally:
        await delete_keys_containing(admin, run_id)
        await admin.aclose()
    print()
    print("## shared group, N worker processes")
    print()
    print("| processes | entries/s (group moved to 0 until all acknowledged) | seconds |")
    print("|---|---|---|")
    for n, rate, seconds in rows:
        print(f"| {n} | {rate:,.0f} | {seconds:.2f} |")


async def until(check: Any, timeout_s: float) -> None:
    """Poll the coroutine function ``check`` every 10 ms until it returns True."""
    with anyio.fail_after(timeout_s):
        while True:
            if await check():
                return
            await anyio.sleep(0.01)


async def _joined(admin: Any, members: str, n: int) -> bool:
    return int(await admin.zcard(members)) >= n


async def _drained(admin: Any, stream: str, service: str) -> bool:
    info = next(g for g in await admin.xinfo_groups(stream) if g["name"] == service)
    return bool(info["pending"] == 0 and info["lag"] == 0)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.shared_group",
        description="GroupConsumer vs a bare redis-py loop; then N worker processes.",
    )
    parser.add_argument("--entries", type=_positive_int, default=50_000)
    parser.add_argument("--rounds", type=_positive_int, default=3)
    parser.add_argument("--batch", type=_positive_int, default=100)
    parser.add_argument("--processes", default="1,2,4", help="process counts, e.g. 1,2,4")
    parser.add_argument("--process-entries", type=_positive_int, default=200_000)
    parser.add_argument("--redis-url", default=DEFAULT_URL)
    parser.add_argument("--use-url", action="store_true", help="use --redis-url as it is")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    ns = parse_args(argv)
    counts = [int(x) for x in ns.processes.split(",") if x.strip()]
    with sigterm_exits(), redis_target(ns.redis_url, ns.use_url) as target:
        anyio.run(one_process, target, ns.entries, ns.rounds, ns.batch)
        if counts:
            anyio.run(n_processes, target, counts, ns.process_entries, ns.batch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
