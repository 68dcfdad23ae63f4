"""Idle-cost benchmark: one consumer owning many idle streams.

A private ``redis-server``; one in-process consumer (lock TTL 10 s, defaults
otherwise) takes ``--streams`` assignments whose streams get no entry. Once it owns
them all, over a ``--window-s`` window of idleness it measures the connections open on
the server, the Redis commands per second (``INFO commandstats``, commands run inside
scripts included) and the consumer process's RSS per owned stream. Idle streams also
re-read by themselves every few minutes (a safety net, ``streamjobs._waiter``): too
rarely to fall inside the window, so their amortized cost is added in a column of
its own. Then it appends one
entry at a time to random idle streams and measures how long each takes to reach
``handle()`` (the wake-up latency, p50 and p99).

Both liveness modes are measured (docs/design.md#liveness), each in a process of its
own so that RSS is measured from a clean start: ``Liveness.LOCK`` extends every lock
every heartbeat, ``Liveness.SESSION`` renews one session key.

Run: ``python -m benchmarks.idle_cost [--streams 2000] [--wakeups 200]
[--liveness lock,session] [--cluster]``.

``--cluster`` runs it on a private OSS Redis Cluster of 3 primaries and 3 replicas
(``streamjobs.testing.LocalCluster``, started for the run and stopped at the end) with
``ClusterMode.OSS``: idle streams then wait on keyspace events of one subscription per
primary (docs/design.md#idle-waiting-on-a-cluster). The connections column is the
most any one primary holds (besides the benchmark's own), the commands are summed over
the primaries.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from typing import Any

import anyio
import redis.asyncio

from streamjobs import ClusterMode, ConsumerConfig, Liveness, Message, Producer, StreamConsumer
from streamjobs._waiter import IDLE_RECHECK_S
from streamjobs.testing import RedisServer

CHUNK = 1000


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        pages = int(statm.read().split()[1])
    return pages * 4096


class _Timed(StreamConsumer):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.started = 0
        self.expected = 0
        self.all_started = anyio.Event()
        self.sent: dict[str, float] = {}
        self.latencies: list[float] = []
        self.arrived = anyio.Event()

    async def on_stream_start(self, stream: str, info: Any) -> None:
        self.started += 1
        if self.started == self.expected:
            self.all_started.set()

    async def handle(self, message: Message) -> None:
        sent = self.sent.pop(message.stream, None)
        if sent is not None:
            self.latencies.append(time.perf_counter() - sent)
            self.arrived.set()


async def _calls(admins: Sequence[Any]) -> tuple[int, int]:
    """All commands so far, and the ZADDs among them (an idle consumer's ZADDs all go
    to the service's lease index, or to its session index: one key each), summed
    over ``admins`` (one plain client per server)."""
    total = zadds = 0
    for admin in admins:
        stats = await admin.info("commandstats")
        total += sum(int(v["calls"]) for k, v in stats.items() if k.startswith("cmdstat_"))
        zadds += int(stats.get("cmdstat_zadd", {}).get("calls", 0))
    return total, zadds


HEADER = (
    "| liveness | connections | Redis commands/s in the window | with idle re-reads | "
    "index writes/s | RSS per stream | wake-up p50 | wake-up p99 |\n"
    "|---|---|---|---|---|---|---|---|"
)
FENCED_READ_COMMANDS = 8
"""MULTI, EVALSHA fence.lua (GET lock, GET cancel marker, XPENDING, XINFO GROUPS),
XREADGROUP, EXEC: what one idle re-read costs."""


def reread_per_s(streams: int) -> float:
    """Commands/s of idle streams re-reading by themselves (streamjobs._waiter): once
    per 0.5-1.0 x IDLE_RECHECK_S each, too rare to fall inside a short window."""
    return streams * FENCED_READ_COMMANDS / (0.75 * IDLE_RECHECK_S)


async def run(
    streams: int, wakeups: int, window_s: float, liveness: Liveness, cluster: bool = False
) -> None:
    with contextlib.ExitStack() as stack:
        if cluster:
            from redis.asyncio.cluster import ClusterNode, RedisCluster

            from streamjobs.testing import LocalCluster  # only when a cluster is asked for

            local = stack.enter_context(LocalCluster())
            nodes = [ClusterNode(h, p) for h, p in local.startup_nodes]
            # The pool check still sizes a cluster pool for a blocking read per stream
            # (the fallback when keyspace flags are refused); far fewer are opened.
            admin: Any = RedisCluster(startup_nodes=nodes)
            client: Any = RedisCluster(startup_nodes=nodes, max_connections=streams + 100)
            servers = [redis.asyncio.Redis(port=p) for p in local.primaries()]
        else:
            server = stack.enter_context(RedisServer(dir_prefix="streamjobs-bench-"))
            admin = redis.asyncio.Redis.from_url(server.url)
            client = redis.asyncio.Redis.from_url(server.url)
            servers = [admin]
        await _measure(streams, wakeups, window_s, liveness, admin, client, servers, cluster)


async def _measure(
    streams: int,
    wakeups: int,
    window_s: float,
    liveness: Liveness,
    admin: Any,
    client: Any,
    servers: Sequence[Any],
    cluster: bool,
) -> None:
    try:
        service = f"idle-{uuid.uuid4().hex[:8]}"
        names = [f"i:{service}:{n}" for n in range(streams)]
        producer = Producer(admin, service=service)
        for name in names:
            await producer.add_stream(name)
        rss_before = _rss_bytes()
        consumer = _Timed(
            client,
            service=service,
            config=ConsumerConfig(max_concurrent_streams=streams, lock_ttl_s=10, liveness=liveness),
            cluster_mode=ClusterMode.OSS if cluster else ClusterMode.NONE,
        )
        consumer.expected = streams
        t0 = time.perf_counter()
        async with consumer:
            with anyio.fail_after(600):
                await consumer.all_started.wait()
            took = time.perf_counter() - t0
            await anyio.sleep(1.0)  # let the last acquisitions go idle
            calls0, zadds0 = await _calls(servers)
            await anyio.sleep(window_s)
            calls1, zadds1 = await _calls(servers)
            per_s = (calls1 - calls0 - 2 * len(servers)) / window_s  # minus our own INFOs
            index_per_s = (zadds1 - zadds0) / window_s
            clients = max([await _clients(s) for s in servers])
            rss = (_rss_bytes() - rss_before) / streams
            rng = random.Random(1)
            for _ in range(wakeups):
                name = rng.choice(names)
                consumer.arrived = anyio.Event()
                consumer.sent[name] = time.perf_counter()
                await producer.append(name, {"n": "1"})
                with anyio.fail_after(30):
                    await consumer.arrived.wait()
                await anyio.sleep(0.01)
        lat = sorted(consumer.latencies)
        p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
        print(
            f"{streams:,} idle streams owned by one consumer, liveness {liveness.value}"
            f"{' on a 3 + 3 cluster' if cluster else ''} "
            f"(taken in {took:.1f} s)",
            file=sys.stderr,
        )
        print(
            f"| {liveness.value}{', cluster' if cluster else ''} | {clients} | {per_s:,.0f} | "
            f"{per_s + reread_per_s(streams):,.0f} | {index_per_s:,.0f} | {rss / 1024:.1f} KiB | "
            f"{statistics.median(lat) * 1000:.1f} ms | {p99 * 1000:.1f} ms |"
        )
    finally:
        await client.aclose()
        await admin.aclose()
        for extra in servers:
            if extra is not admin:
                await extra.aclose()


async def _clients(server: Any) -> int:
    """Connections open on ``server``, the asking one aside (the benchmark's producer
    holds one or two more; the cluster bus is not counted by Redis)."""
    return int((await server.info("clients"))["connected_clients"]) - 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.idle_cost")
    parser.add_argument("--streams", type=int, default=2000)
    parser.add_argument("--wakeups", type=int, default=200)
    parser.add_argument("--window-s", type=float, default=10.0)
    parser.add_argument(
        "--liveness",
        default="lock,session",
        help="comma-separated liveness modes, each measured in a fresh process",
    )
    parser.add_argument(
        "--cluster", action="store_true", help="on a private 3 + 3 OSS cluster (ClusterMode.OSS)"
    )
    parser.add_argument("--row-only", action="store_true", help=argparse.SUPPRESS)
    ns = parser.parse_args(argv)
    modes = [Liveness(m.strip()) for m in ns.liveness.split(",") if m.strip()]
    if ns.row_only:
        anyio.run(run, ns.streams, ns.wakeups, ns.window_s, modes[0], ns.cluster)
        return 0
    where = ", 3 + 3 cluster: connections of the busiest primary" if ns.cluster else ""
    print(f"{ns.streams:,} idle streams owned by one consumer (lock TTL 10 s{where})")
    print(HEADER, flush=True)
    for mode in modes:
        args = ["--streams", str(ns.streams), "--wakeups", str(ns.wakeups)]
        args += ["--window-s", str(ns.window_s), "--liveness", mode.value, "--row-only"]
        args += ["--cluster"] if ns.cluster else []
        done = subprocess.run(
            [sys.executable, "-m", "benchmarks.idle_cost", *args],
            capture_output=True,
            text=True,
            check=False,
        )
        sys.stderr.write(done.stderr)
        if done.returncode:
            raise SystemExit(f"idle_cost --liveness {mode.value} failed ({done.returncode})")
        print(done.stdout, end="", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
