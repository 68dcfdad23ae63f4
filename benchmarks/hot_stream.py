"""Hot-stream benchmark: one data stream, drained by one consumer in one process.

Two contenders drain the same workload (N entries of ~100 bytes, produced in advance
with pipelined XADDs, not timed), alternated within one run, each round on fresh keys:

* ``bare``: a bare redis-py batch loop: ``XREADGROUP COUNT batch``, a no-op ``async``
  handler per entry, then one ``XACK`` of the whole batch pipelined with the next read;
* ``streamjobs``: a :class:`~streamjobs.StreamConsumer` with a no-op handler that owns
  the stream through one assignment, timed from ``async with consumer`` until
  ``on_stream_end`` fires (the stream is closed with the end marker).

Both contenders must handle exactly N entries, or the benchmark raises
:class:`BenchmarkError`. Redis command counts come from ``INFO commandstats`` deltas.

Run: ``python -m benchmarks.hot_stream [--entries N] [--rounds 3] [--batch 100]``.
``--bytes`` runs streamjobs in bytes mode (``StreamConsumer[bytes]``): its handler then
gets the fields undecoded, like the bare loop's.
By default a private ``redis-server`` is started (less noise) and stopped at the end;
``--use-url`` uses ``--redis-url`` instead. Only keys holding this run's id are written
and deleted; nothing is ever flushed. See benchmarks/README.md.

``--cluster`` runs the same scenario on a private OSS Redis Cluster of 3 primaries and
3 replicas (``streamjobs.testing.LocalCluster``, imported only then), started for
the run and stopped at the end, also on an error, Ctrl-C or SIGTERM. Both contenders
then use ``redis.asyncio.cluster.RedisCluster``: the bare loop's pipelined ``XACK`` +
``XREADGROUP`` name the same stream, so one slot and one node, and stay one round trip
per batch (its ``XREADGROUP`` is sent to that primary explicitly: see
:func:`xreadgroup`); streamjobs runs with ``cluster_mode=ClusterMode.OSS``. The stream
lives on one primary, so this measures the cluster client path, not any spreading of
load. Command counts are ``INFO commandstats`` summed over the primaries.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import platform
import signal
import statistics
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import redis
import redis.asyncio
from redis.asyncio.cluster import RedisCluster
from redis.utils import HIREDIS_AVAILABLE

from streamjobs import (
    ClusterMode,
    ConsumerConfig,
    Message,
    Producer,
    RecoveryConfig,
    StreamConsumer,
)
from streamjobs._urls import redact
from streamjobs.cli import DEFAULT_URL
from streamjobs.testing import RedisServer, RedisServerError, answers, server_binary

PAYLOAD_BYTES = 100
PRODUCE_CHUNK = 1000
BARE = "bare"
STREAMJOBS = "streamjobs"
# Commands the harness itself sends while a contender is measured, and on a cluster
# the REPLCONF ACKs the replicas send their primaries every second.
HARNESS_COMMANDS = frozenset({"info", "config|resetstat", "replconf"})


class BenchmarkError(RuntimeError):
    """A contender did not process exactly the expected entries, or Redis is missing."""


# -- Redis: a private server or a given URL ---------------------------------------------


@dataclass(frozen=True, slots=True)
class Target:
    url: str
    private: bool
    cluster: bool = False
    """An OSS Redis Cluster (``url`` names one of its nodes)."""


@contextlib.contextmanager
def private_cluster() -> Iterator[Target]:
    """A private 3-primary + 3-replica cluster for the run, stopped at the end.

    ``LocalCluster`` is imported only here, when a cluster is asked for.
    """
    from streamjobs.testing import ClusterStartupError, LocalCluster

    try:
        cluster = LocalCluster().start()
    except ClusterStartupError as exc:
        raise BenchmarkError(str(exc)) from exc
    try:
        yield Target(cluster.url, private=True, cluster=True)
    finally:
        cluster.stop()


@contextlib.contextmanager
def sigterm_exits() -> Iterator[None]:
    """While open, SIGTERM raises :class:`SystemExit` (exit code 143), so ``finally``
    blocks run and the private servers are stopped; the old handler comes back after.
    Outside the main thread (where signals cannot be handled) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def exit_on_sigterm(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, exit_on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


@contextlib.contextmanager
def redis_target(url: str, use_url: bool, cluster: bool = False) -> Iterator[Target]:
    """A private server unless ``use_url`` (or no ``redis-server`` binary is installed);
    with ``cluster``, a private cluster (never a given URL)."""
    if cluster:
        if use_url:
            raise BenchmarkError("--cluster starts a private cluster: it takes no --use-url")
        if server_binary() is None:
            raise BenchmarkError("--cluster needs redis-server (or valkey-server)")
        with private_cluster() as target:
            yield target
        return
    if not use_url:
        if server_binary() is not None:
            try:
                server = RedisServer(dir_prefix="streamjobs-bench-").start()
            except RedisServerError as exc:
                raise BenchmarkError(str(exc)) from exc
            try:
                yield Target(server.url, private=True)
            finally:
                server.stop()
            return
        print(f"note: redis-server is not on PATH; using {redact(url)}", flush=True)
    if not answers(url, timeout_s=2.0):
        raise BenchmarkError(
            f"no Redis answers at {redact(url)} (and no private server was started)"
        )
    yield Target(url, private=False)


# -- measurement helpers ------------------------------------------------------------------


@dataclass(slots=True)
class Result:
    contender: str
    entries: int
    seconds: float
    commands: Counter[str] = field(default_factory=Counter)
    server_usec: Counter[str] = field(default_factory=Counter)
    startup_s: float = 0.0

    @property
    def rate(self) -> float:
        return self.entries / self.seconds

    @property
    def commands_total(self) -> int:
        return sum(self.commands.values())


Stats = tuple[Counter[str], Counter[str]]
"""(calls, usec) per command name."""


def connect(target: Target, *, decode_responses: bool) -> Any:
    """An async client for ``target``: ``RedisCluster`` on a cluster, else ``Redis``."""
    if target.cluster:
        return RedisCluster.from_url(target.url, decode_responses=decode_responses)
    return redis.asyncio.Redis.from_url(target.url, decode_responses=decode_responses)


async def command_stats(admin: Any) -> Stats:
    """Calls and server microseconds per command from ``INFO commandstats``; on a
    cluster, summed over the primaries (replicas only replay what these ran)."""
    if isinstance(admin, RedisCluster):
        per_node: dict[str, Any] = await admin.info(
            "commandstats", target_nodes=RedisCluster.PRIMARIES
        )
        nodes = list(per_node.values())
    else:
        nodes = [await admin.info("commandstats")]
    calls: Counter[str] = Counter()
    usec: Counter[str] = Counter()
    for stats in nodes:
        for name, value in stats.items():
            calls[name.removeprefix("cmdstat_")] += int(value["calls"])
            usec[name.removeprefix("cmdstat_")] += int(value["usec"])
    return calls, usec


def _delta(before: Counter[str], after: Counter[str]) -> Counter[str]:
    delta: Counter[str] = Counter()
    for name, value in after.items():
        if name not in HARNESS_COMMANDS and value > before.get(name, 0):
            delta[name] = value - before.get(name, 0)
    return delta


def stats_delta(before: Stats, after: Stats) -> Stats:
    """What was run between two snapshots, without the harness's own commands."""
    return _delta(before[0], after[0]), _delta(before[1], after[1])


async def start_counting(admin: Any, target: Target) -> Stats:
    """Reset the server's command statistics (private server only; on a cluster, every
    primary's); return a snapshot."""
    if target.private:
        if isinstance(admin, RedisCluster):
            await admin.config_resetstat(target_nodes=RedisCluster.PRIMARIES)
        else:
            await admin.config_resetstat()
    return await command_stats(admin)


async def produce(client: Any, stream: str, n: int) -> None:
    """Append ``n`` entries of ~100 bytes with pipelined XADDs (not timed)."""
    for start in range(0, n, PRODUCE_CHUNK):
        async with client.pipeline(transaction=False) as pipe:
            for i in range(start, min(n, start + PRODUCE_CHUNK)):
                prefix = f"{i:010d}:"
                pipe.xadd(stream, {"payload": prefix + "x" * (PAYLOAD_BYTES - len(prefix))})
            await pipe.execute()


async def delete_keys_containing(admin: Any, fragment: str) -> int:
    """SCAN + DEL every key whose name contains ``fragment`` (never a flush)."""
    deleted = 0
    async for key in admin.scan_iter(match=f"*{fragment}*", count=1000):
        deleted += int(await admin.delete(key))
    return deleted


# -- contender a: the bare batch loop ---------------------------------------------------


async def _noop(entry_id: bytes, fields: dict[bytes, bytes]) -> None:
    return None


def xreadgroup(client: Any, node: Any, group: str, consumer: str, stream: str, count: int) -> Any:
    """``XREADGROUP`` on ``client`` (a client: awaitable; a pipeline: queued).

    With a cluster ``node`` (the primary of the stream's slot) the read is sent there
    explicitly: left to route it, redis-py's cluster client asks a server
    ``COMMAND GETKEYS`` (twice, one round trip each) for every ``XREADGROUP``, a command
    whose key it cannot locate by position. Pinning the node is what a careful
    hand-written loop does, and what streamjobs' fenced read does too.
    """
    if node is None:
        return client.xreadgroup(group, consumer, {stream: ">"}, count=count)
    command = ("XREADGROUP", "GROUP", group, consumer, "COUNT", count, "STREAMS", stream, ">")
    return client.execute_command(*command, target_nodes=node)


async def run_bare(
    client: Any, admin: Any, target: Target, stream: str, n: int, batch: int
) -> Result:
    await produce(client, stream, n)
    group, consumer = "bench", "bare-0"
    await client.xgroup_create(stream, group, id="0")
    node = client.get_node_from_key(stream) if target.cluster else None
    before = await start_counting(admin, target)
    gc.collect()
    handled = 0
    t0 = time.perf_counter()
    reply = await xreadgroup(client, node, group, consumer, stream, batch)
    while reply:
        ids: list[bytes] = []
        for _name, entries in reply:
            for entry_id, fields in entries:
                await _noop(entry_id, fields)
                ids.append(entry_id)
        handled += len(ids)
        async with client.pipeline(transaction=False) as pipe:
            pipe.xack(stream, group, *ids)
            xreadgroup(pipe, node, group, consumer, stream, batch)
            _, reply = await pipe.execute()
    elapsed = time.perf_counter() - t0
    commands, usec = stats_delta(before, await command_stats(admin))
    pending = int((await client.xpending(stream, group))["pending"])
    await client.delete(stream)
    if handled != n or pending != 0:
        raise BenchmarkError(f"bare: handled {handled}/{n} entries, {pending} still pending")
    return Result(BARE, handled, elapsed, commands, usec)


# -- contender b: streamjobs ------------------------------------------------------------


class BenchConsumer(StreamConsumer):
    """No-op handler that counts entries; signals ``done`` when its stream finishes."""

    def __init__(self, redis_client: Any, *, done: anyio.Event, **kwargs: Any) -> None:
        super().__init__(redis_client, **kwargs)
        self.count = 0
        self.ended: list[str] = []
        self._done = done

    async def handle(self, message: Message) -> None:
        self.count += 1

    async def on_stream_end(self, stream: str) -> None:
        self.ended.append(stream)
        self._done.set()


class BytesBenchConsumer(StreamConsumer[bytes]):
    """:class:`BenchConsumer` in bytes mode: ``handle()`` gets the fields undecoded,
    as the bare loop's handler does."""

    def __init__(self, redis_client: Any, *, done: anyio.Event, **kwargs: Any) -> None:
        super().__init__(redis_client, **kwargs)
        self.count = 0
        self.ended: list[str] = []
        self._done = done

    async def handle(self, message: Message[bytes]) -> None:
        self.count += 1

    async def on_stream_end(self, stream: str) -> None:
        self.ended.append(stream)
        self._done.set()


async def run_streamjobs(
    client: Any,
    admin: Any,
    target: Target,
    stream: str,
    service: str,
    n: int,
    batch: int,
    raw: bool = False,
) -> Result:
    producer = Producer(client, service=service)
    await produce(client, stream, n)
    await producer.close_stream(stream)
    await producer.add_stream(stream, {"bench": "hot_stream"})
    done = anyio.Event()
    consumer = (BytesBenchConsumer if raw else BenchConsumer)(
        client,
        done=done,
        service=service,
        config=ConsumerConfig(read_batch_size=batch, lock_ttl_s=30, finished_stream_ttl_s=0),
        # Only touch notify-keyspace-events on a server we started ourselves.
        recovery=RecoveryConfig(min_idle_s=45, configure_keyspace_events=target.private),
        cluster_mode=ClusterMode.OSS if target.cluster else ClusterMode.NONE,
    )
    before = await start_counting(admin, target)
    gc.collect()
    timeout_s = max(60.0, n / 500)
    t0 = time.perf_counter()
    try:
        async with consumer:
            startup = time.perf_counter() - t0
            with anyio.fail_after(timeout_s):
                await done.wait()
            elapsed = time.perf_counter() - t0
    except TimeoutError:
        raise BenchmarkError(
            f"streamjobs: stream not finished after {timeout_s:.0f}s "
            f"(handled {consumer.count}/{n} entries)"
        ) from None
    commands, usec = stats_delta(before, await command_stats(admin))
    leftover = int(await client.exists(stream))
    if consumer.count != n or consumer.ended != [stream] or leftover:
        raise BenchmarkError(
            f"streamjobs: handled {consumer.count}/{n} entries, ended {consumer.ended!r}, "
            f"stream {'still exists' if leftover else 'deleted'}"
        )
    return Result(STREAMJOBS, consumer.count, elapsed, commands, usec, startup_s=startup)


# -- the run ----------------------------------------------------------------------------


@dataclass(slots=True)
class Round:
    index: int
    order: tuple[str, ...]
    results: dict[str, Result]

    @property
    def ratio(self) -> float:
        return self.results[STREAMJOBS].rate / self.results[BARE].rate


@dataclass(slots=True)
class Summary:
    rounds: list[Round]
    entries: int
    batch: int

    def rates(self, contender: str) -> list[float]:
        return [r.results[contender].rate for r in self.rounds]

    @property
    def ratios(self) -> list[float]:
        return [r.ratio for r in self.rounds]

    def commands_per_entry(self, contender: str) -> tuple[float, Counter[str]]:
        total: Counter[str] = Counter()
        for r in self.rounds:
            total.update(r.results[contender].commands)
        entries = self.entries * len(self.rounds)
        return sum(total.values()) / entries, total

    def server_usec(self, contender: str) -> Counter[str]:
        total: Counter[str] = Counter()
        for r in self.rounds:
            total.update(r.results[contender].server_usec)
        return total


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


async def _describe(admin: Any, target: Target) -> str:
    server: dict[str, Any] = await admin.info("server")
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    if target.cluster:
        primaries = len(admin.get_primaries())
        where = (
            f"a private OSS Redis Cluster, {primaries} primaries + {primaries} replicas "
            "(no persistence)"
        )
    elif target.private:
        where = "private redis-server (--save '' --appendonly no)"
    else:
        where = target.url
    return (
        f"machine: {os.cpu_count()} CPUs ({_cpu_model()}), load average {load}\n"
        f"python {platform.python_version()} ({platform.python_implementation()}), "
        f"redis-py {redis.__version__}, hiredis parser {'on' if HIREDIS_AVAILABLE else 'OFF'}, "
        f"anyio {anyio_version()}\n"
        f"redis {server.get('redis_version', '?')} at {where}"
    )


def anyio_version() -> str:
    from importlib.metadata import version

    return version("anyio")


def _breakdown(commands: Counter[str], entries: int, top: int = 8) -> str:
    return ", ".join(f"{name} {calls / entries:.4f}" for name, calls in commands.most_common(top))


async def run_benchmark(
    target: Target, entries: int, rounds: int, batch: int, raw: bool = False
) -> Summary:
    run_id = uuid.uuid4().hex[:12]
    client = connect(target, decode_responses=False)
    admin = connect(target, decode_responses=True)
    done: list[Round] = []
    heading = None
    try:
        if target.cluster:
            await admin.initialize()
            heading = f"## hot stream on the cluster ({len(admin.get_primaries())} primaries)"
        if raw:
            heading = f"{heading or '## hot stream'}, bytes mode"
        print(await _describe(admin, target), flush=True)
        print(
            f"workload: {entries:,} entries of ~{PAYLOAD_BYTES} B, batch {batch}, "
            f"{rounds} round(s), run id {run_id}"
            + (", streamjobs in bytes mode (StreamConsumer[bytes])" if raw else ""),
            flush=True,
        )
        if not target.private:
            print("note: shared server: command counts include other clients' commands")
        for index in range(rounds):
            order = (BARE, STREAMJOBS) if index % 2 == 0 else (STREAMJOBS, BARE)
            results: dict[str, Result] = {}
            for contender in order:
                stream = f"bench:{run_id}:r{index}:{contender}"
                if contender == BARE:
                    result = await run_bare(client, admin, target, stream, entries, batch)
                else:
                    service = f"bench-{run_id}-r{index}"
                    result = await run_streamjobs(
                        client, admin, target, stream, service, entries, batch, raw
                    )
                results[contender] = result
            rnd = Round(index, order, results)
            done.append(rnd)
            b, s = results[BARE], results[STREAMJOBS]
            print(
                f"round {index + 1}/{rounds} (order {' -> '.join(order)}): "
                f"bare {b.rate:,.0f} entries/s ({b.seconds:.3f} s) | "
                f"streamjobs {s.rate:,.0f} entries/s ({s.seconds:.3f} s, "
                f"startup {s.startup_s * 1000:.0f} ms) | ratio streamjobs/bare {rnd.ratio:.3f}",
                flush=True,
            )
            print(
                f"  verified: bare handled {b.entries}/{entries}, "
                f"streamjobs handled {s.entries}/{entries}",
                flush=True,
            )
    finally:
        with contextlib.suppress(redis.RedisError, OSError):
            await delete_keys_containing(admin, run_id)
        await client.aclose()
        await admin.aclose()
    summary = Summary(done, entries, batch)
    _print_summary(summary, heading)
    return summary


def _spread(values: Sequence[float], fmt: str) -> str:
    mid, low, high = (format(v, fmt) for v in (statistics.median(values), min(values), max(values)))
    return f"{mid} ({low}-{high})"


def _print_summary(summary: Summary, heading: str | None = None) -> None:
    bare_cpe, bare_cmds = summary.commands_per_entry(BARE)
    sj_cpe, sj_cmds = summary.commands_per_entry(STREAMJOBS)
    total = summary.entries * len(summary.rounds)
    print()
    print(f"median bare rate:       {_spread(summary.rates(BARE), ',.0f')} entries/s")
    print(f"median streamjobs rate: {_spread(summary.rates(STREAMJOBS), ',.0f')} entries/s")
    print(f"median ratio streamjobs/bare: {_spread(summary.ratios, '.3f')} (goal >= 0.5)")
    print(f"Redis commands/entry, bare: {bare_cpe:.4f} ({_breakdown(bare_cmds, total)})")
    print(
        f"Redis commands/entry, streamjobs: {sj_cpe:.4f} ({_breakdown(sj_cmds, total)}; "
        "commands run inside Lua scripts are counted too; "
        f"round trips/entry ~ evalsha {sj_cmds['evalsha'] / total:.4f})"
    )
    bare_us = sum(summary.server_usec(BARE).values()) / total
    sj_script_us = summary.server_usec(STREAMJOBS)["evalsha"] / total
    print(
        f"Redis server time/entry: bare {bare_us:.2f} us (all its commands); streamjobs "
        f"{sj_script_us:.2f} us in EVALSHA alone (fence.lua; inner commands included)"
    )
    print()
    if heading is not None:
        print(heading)
        print()
    print(
        "| round | bare entries/s | streamjobs entries/s | ratio streamjobs/bare "
        "| streamjobs cmds/entry | server us/entry bare / streamjobs EVALSHA |"
    )
    print("|---|---|---|---|---|---|")
    for r in summary.rounds:
        b, s = r.results[BARE], r.results[STREAMJOBS]
        print(
            f"| {r.index + 1} | {b.rate:,.0f} | {s.rate:,.0f} | {r.ratio:.3f} | "
            f"{s.commands_total / s.entries:.4f} | "
            f"{sum(b.server_usec.values()) / b.entries:.2f} / "
            f"{s.server_usec['evalsha'] / s.entries:.2f} |"
        )
    print(
        f"| median | {statistics.median(summary.rates(BARE)):,.0f} | "
        f"{statistics.median(summary.rates(STREAMJOBS)):,.0f} | "
        f"{statistics.median(summary.ratios):.3f} | {sj_cpe:.4f} (all rounds) | "
        f"{bare_us:.2f} / {sj_script_us:.2f} (all rounds) |"
    )


def _positive_int(value: str) -> int:
    n = int(value)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {n}")
    return n


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.hot_stream",
        description="streamjobs vs a bare redis-py batch loop on one hot stream.",
    )
    parser.add_argument(
        "--redis-url",
        default=DEFAULT_URL,
        help="Redis to use with --use-url, or when redis-server is not installed "
        f"(default {DEFAULT_URL})",
    )
    parser.add_argument(
        "--use-url",
        action="store_true",
        help="use --redis-url instead of starting a private redis-server",
    )
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="run on a private 3-primary + 3-replica OSS Redis Cluster started for the run",
    )
    parser.add_argument("--entries", type=_positive_int, default=100_000)
    parser.add_argument("--rounds", type=_positive_int, default=3)
    parser.add_argument("--batch", type=_positive_int, default=100)
    parser.add_argument(
        "--bytes",
        action="store_true",
        help="run streamjobs in bytes mode (StreamConsumer[bytes]: fields undecoded)",
    )
    args = parser.parse_args(argv)
    if args.cluster and args.use_url:
        parser.error("--cluster starts a private cluster: it cannot be combined with --use-url")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    with sigterm_exits(), redis_target(args.redis_url, args.use_url, args.cluster) as target:
        anyio.run(run_benchmark, target, args.entries, args.rounds, args.batch, args.bytes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
