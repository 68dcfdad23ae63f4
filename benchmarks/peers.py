"""Hot-stream benchmark against peer libraries: FastStream, taskiq-redis and streaQ.

The workload is the one of :mod:`benchmarks.hot_stream`: one Redis stream of N entries
with a ~100-byte payload, produced in advance (not timed), drained by one consumer in
this process with a no-op ``async`` handler. Every round uses fresh keys (the run id, a
uuid, is in every key name) and runs the contenders one after the other in this order:
``bare``, ``streamjobs``, ``streamjobs-group``, ``faststream``, ``faststream-batch``,
``taskiq``, ``streaq``;
then the next round. Each contender must handle exactly N entries (its handler counts
them, and nothing may be left pending), or the run fails with :class:`BenchmarkError`.
The result per contender is the median of the rounds.

The two references are :func:`benchmarks.hot_stream.run_bare` (``XREADGROUP COUNT
batch``, a no-op handler per entry, one ``XACK`` per batch pipelined with the next read)
and :func:`benchmarks.hot_stream.run_streamjobs`, unchanged; ``streamjobs-group`` is
:func:`benchmarks.shared_group.run_group`: a ``GroupConsumer`` reading the stream in a
shared group, the same kind of consumer as the peers' group subscribers. The peers, each set up with
its documented public API, as close to "one stream read in batches of ``batch``, one
no-op handler call per entry" as the library allows:

* ``faststream`` (``faststream[redis]``): a ``RedisBroker`` started in this process
  (``broker.start()`` / ``broker.stop()``, no ``FastStream`` app), one subscriber on
  ``StreamSub(stream, group=..., consumer=..., max_records=batch)``: ``XREADGROUP COUNT
  batch`` (block 100 ms), then per entry the handler ``async def handle(body: str)``
  and an awaited ``XACK`` of that entry (its default ack policy; a per-message
  subscriber has no batched ack). The entries are published beforehand with
  ``broker.publish(payload, stream=..., pipeline=...)`` (FastStream's own message
  format: the ``__data__`` field holds the payload and its headers), and the consumer
  group is created at ``0`` before the broker starts, as for ``bare`` (FastStream
  itself would create it at ``$`` and skip them). Its logging is off (``logger=None``,
  its documented switch): otherwise it writes two access-log lines per message, and no
  other contender logs per entry.
* ``faststream-batch``: the same with ``StreamSub(..., batch=True)``, FastStream's
  batch subscriber: one handler call per read gets the list of (up to ``batch``)
  decoded bodies and awaits the no-op per body; one ``XACK`` of the whole batch, then
  the next read (two round trips per batch). Not asked for by name, but it is how a
  FastStream user would drain a hot stream, and the per-message mode alone would
  understate FastStream.
* ``taskiq`` (``taskiq-redis``): a ``RedisStreamBroker`` (``xread_count=batch``,
  consumer group created at ``0``) and a task ``async def noop(payload: str)``. The N
  entries are ``noop.kiq(payload)`` calls made beforehand by a second broker instance
  (the client side; one ``XADD`` each, ``{data: <taskiq message JSON>}``): the format a
  taskiq worker actually reads, produced by its own public API rather than imitated.
  The worker is taskiq's ``Receiver`` run in-process (what ``taskiq worker`` and
  ``taskiq.api.run_receiver_task`` run), defaults otherwise: every entry becomes an
  asyncio task (at most 100 at once), acked on its own with an awaited ``XACK`` once
  its (empty) result is "saved"; after every read the broker also runs an
  ``XAUTOCLAIM`` of stale entries under a Redis lock. taskiq has no batch handler.
* ``streaq``: a ``Worker`` with one task ``async def noop(payload: str)`` registered
  with ``silent=True, ttl=0`` (no per-task log line and no result kept: nobody reads
  the result of a no-op; the default would write and expire one per task), run by
  ``worker.run_async()`` in burst mode (``worker.burst = True``, what ``streaq run
  --burst`` sets: it returns once the queue is empty) with ``handle_signals=False``,
  its default ``concurrency`` (16) and ``prefetch`` set so that it reads up to
  ``batch`` entries per ``XREADGROUP``. streaQ is a task queue, not a stream consumer:
  the N tasks are enqueued up front with ``worker.enqueue_many`` (pipelined, not timed)
  by a second ``Worker`` instance; each task is a stream entry holding its id plus a
  key holding the pickled call, and the worker runs per task one pipeline (fetch the
  call, retry counter, abort check, ownership refresh) and one ``MULTI`` (``XACK``,
  ``XDEL``, result ``PUBLISH``, bookkeeping). That per-task state is what streaQ is,
  so it is measured as is.

Timing: each contender is timed from its start-up (``broker.start()``, the receiver's
``listen``, ``worker.run_async()``; ``bare`` from its first read and ``streamjobs``
from ``async with consumer``) until its handler has seen N entries and nothing is left
pending (faststream, taskiq: polled with ``XPENDING`` once the count is reached;
streaq: until ``run_async`` returns). Redis command counts come from ``INFO
commandstats`` deltas over the timed part (commands run inside Lua scripts and
functions included; on a shared server they include other clients' commands).

A peer whose package is not installed is skipped with a one-line note (install them
with ``pip install -e '.[bench]'``); the module imports without them, and mypy checks
it with or without them (the peer imports are local and marked
``type: ignore[import-not-found, unused-ignore]``).

Run: ``python -m benchmarks.peers [--entries N] [--rounds 3] [--batch 100]
[--contenders faststream,faststream-batch,taskiq,streaq] [--json PATH]``. Redis as in
``hot_stream``: a private ``redis-server`` unless ``--use-url``. On a server it did not
start, streaQ leaves its Lua function library (``FUNCTION LOAD`` of the library
``streaq``) loaded: it is not a key and is not removed. benchmarks/README.md describes
the hot-stream workload and the two references.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.util
import json
import statistics
import sys
import time
import uuid
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import anyio
import redis
import redis.asyncio

from benchmarks.hot_stream import (
    BARE,
    PAYLOAD_BYTES,
    STREAMJOBS,
    BenchmarkError,
    Result,
    Target,
    _describe,
    command_stats,
    delete_keys_containing,
    redis_target,
    run_bare,
    run_streamjobs,
    start_counting,
    stats_delta,
)
from streamjobs.cli import DEFAULT_URL

FASTSTREAM = "faststream"
FASTSTREAM_BATCH = "faststream-batch"
TASKIQ = "taskiq"
STREAQ = "streaq"
PEERS = (FASTSTREAM, FASTSTREAM_BATCH, TASKIQ, STREAQ)
STREAMJOBS_GROUP = "streamjobs-group"
REFERENCES = (BARE, STREAMJOBS, STREAMJOBS_GROUP)
CONTENDERS = REFERENCES + PEERS
# The module each peer needs; the distributions whose versions are printed.
PEER_MODULES = {
    FASTSTREAM: "faststream",
    FASTSTREAM_BATCH: "faststream",
    TASKIQ: "taskiq_redis",
    STREAQ: "streaq",
}
PEER_DISTRIBUTIONS = {
    FASTSTREAM: ("faststream", "pydantic"),
    FASTSTREAM_BATCH: ("faststream", "pydantic"),
    TASKIQ: ("taskiq", "taskiq-redis", "pydantic"),
    STREAQ: ("streaq", "coredis"),
}
GROUP = "bench"
PUBLISH_CHUNK = 1000
KIQ_CONCURRENCY = 50


def payload(i: int) -> str:
    """The ~100-byte payload of entry ``i``, as :func:`benchmarks.hot_stream.produce`."""
    prefix = f"{i:010d}:"
    return prefix + "x" * (PAYLOAD_BYTES - len(prefix))


def installed(contender: str) -> bool:
    """Whether the package a contender needs can be imported (the references always)."""
    module = PEER_MODULES.get(contender)
    return module is None or importlib.util.find_spec(module) is not None


def peer_versions(contenders: Sequence[str]) -> dict[str, str]:
    """Version of every distribution the given peers run on."""
    versions: dict[str, str] = {}
    for contender in contenders:
        for dist in PEER_DISTRIBUTIONS.get(contender, ()):
            try:
                versions[dist] = version(dist)
            except PackageNotFoundError:
                versions[dist] = "?"
    return versions


MIN_TIMEOUT_S = 60.0


def _timeout_s(n: int) -> float:
    """Generous: at least 200 entries/s, and never under ``MIN_TIMEOUT_S``."""
    return max(MIN_TIMEOUT_S, n / 200)


class Tally:
    """The count a no-op handler keeps; ``done`` is set when it reaches ``n``."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.count = 0
        self.done = anyio.Event()

    def hit(self) -> None:
        self.count += 1
        if self.count == self.n:
            self.done.set()


async def _pending(client: Any, stream: str, group: str) -> int:
    return int((await client.xpending(stream, group))["pending"])


async def _wait_handled_and_acked(
    client: Any, name: str, tally: Tally, stream: str, group: str
) -> None:
    """Until the handler saw N entries and none is pending; BenchmarkError on timeout."""
    timeout_s = _timeout_s(tally.n)
    try:
        with anyio.fail_after(timeout_s):
            await tally.done.wait()
            # The last acks may still be on their way (an awaited XACK per entry).
            while True:
                if not await _pending(client, stream, group):
                    break
                await anyio.sleep(0.0005)
    except TimeoutError:
        raise BenchmarkError(
            f"{name}: not done after {timeout_s:.0f}s (handled {tally.count}/{tally.n} entries)"
        ) from None


def _check(name: str, handled: int, n: int, pending: int, extra: str = "") -> None:
    if handled != n or pending != 0:
        raise BenchmarkError(
            f"{name}: handled {handled}/{n} entries, {pending} still pending{extra}"
        )


# -- faststream -------------------------------------------------------------------------


async def run_faststream(
    client: Any,
    admin: Any,
    target: Target,
    stream: str,
    n: int,
    batch: int,
    *,
    batch_handler: bool = False,
) -> Result:
    from faststream.redis import (  # type: ignore[import-not-found, unused-ignore]
        RedisBroker,
        StreamSub,
    )

    name = FASTSTREAM_BATCH if batch_handler else FASTSTREAM
    tally = Tally(n)

    async def handle(body: str) -> None:
        tally.hit()

    async def handle_batch(bodies: list[str]) -> None:
        for body in bodies:
            await handle(body)

    # logger=None is FastStream's documented switch for its logs (per message: the
    # "Received" and "Processed" access lines); its type hint does not admit None.
    broker = RedisBroker(target.url, logger=None)  # type: ignore[arg-type, unused-ignore]
    consumer = f"{name}-0"
    if batch_handler:
        sub = StreamSub(stream, group=GROUP, consumer=consumer, max_records=batch, batch=True)
        broker.subscriber(stream=sub)(handle_batch)
    else:
        one = StreamSub(stream, group=GROUP, consumer=consumer, max_records=batch)
        broker.subscriber(stream=one)(handle)
    try:
        await broker.connect()
        for start in range(0, n, PUBLISH_CHUNK):
            async with client.pipeline(transaction=False) as pipe:
                for i in range(start, min(n, start + PUBLISH_CHUNK)):
                    await broker.publish(payload(i), stream=stream, pipeline=pipe)
                await pipe.execute()
        # FastStream creates a missing group at "$" (new entries only); like the bare
        # loop, read the stream from its start.
        await client.xgroup_create(stream, GROUP, id="0")
        before = await start_counting(admin, target)
        gc.collect()
        t0 = time.perf_counter()
        await broker.start()
        startup = time.perf_counter() - t0
        await _wait_handled_and_acked(client, name, tally, stream, GROUP)
        elapsed = time.perf_counter() - t0
        commands, usec = stats_delta(before, await command_stats(admin))
    finally:
        await broker.stop()
    _check(name, tally.count, n, await _pending(client, stream, GROUP))
    await client.delete(stream)
    return Result(name, tally.count, elapsed, commands, usec, startup_s=startup)


# -- taskiq -----------------------------------------------------------------------------


async def run_taskiq(
    client: Any, admin: Any, target: Target, stream: str, n: int, batch: int
) -> Result:
    from taskiq.receiver import Receiver  # type: ignore[import-not-found, unused-ignore]
    from taskiq_redis import RedisStreamBroker  # type: ignore[import-not-found, unused-ignore]

    tally = Tally(n)

    async def noop(payload: str) -> None:
        tally.hit()

    def make_broker(consumer: str) -> RedisStreamBroker:
        broker = RedisStreamBroker(
            target.url,
            queue_name=stream,
            consumer_group_name=GROUP,
            consumer_name=consumer,
            consumer_id="0",  # the group reads the stream from its start, as bare
            xread_count=batch,
        )
        broker.task(task_name="bench_noop")(noop)
        return broker

    # The client side: kiq() the N messages (not timed), KIQ_CONCURRENCY at a time.
    kicker = make_broker("taskiq-client")
    await kicker.startup()
    try:
        task = kicker.find_task("bench_noop")
        if task is None:
            raise BenchmarkError("taskiq: the task was not registered")
        for start in range(0, n, KIQ_CONCURRENCY):
            async with anyio.create_task_group() as tg:
                for i in range(start, min(n, start + KIQ_CONCURRENCY)):
                    tg.start_soon(task.kiq, payload(i))
    finally:
        await kicker.shutdown()

    worker = make_broker("taskiq-0")
    worker.is_worker_process = True
    finish = anyio.Event()
    error: BenchmarkError | None = None
    before = await start_counting(admin, target)
    gc.collect()
    t0 = time.perf_counter()
    listened = anyio.Event()
    forced: list[bool] = []  # _stop_receiver had to close the connections under it

    async def listen() -> None:
        try:
            await _listen(receiver, finish)
        except Exception:
            if not forced:
                raise
            # The read it was stuck on failed when its connections were closed, and
            # the receiver re-raises that once stopped: expected, nothing was lost.
        finally:
            listened.set()

    try:
        async with anyio.create_task_group() as tg:
            # max_async_tasks: the default of `taskiq worker` and run_receiver_task.
            receiver = Receiver(worker, run_startup=True, max_async_tasks=100)
            tg.start_soon(listen)
            try:
                await _wait_handled_and_acked(client, TASKIQ, tally, stream, GROUP)
                elapsed = time.perf_counter() - t0
                commands, usec = stats_delta(before, await command_stats(admin))
            except BenchmarkError as exc:
                error = exc  # raised below, not wrapped in the task group's ExceptionGroup
            finally:
                finish.set()  # a graceful stop: the receiver finishes what it holds
                await _stop_receiver(worker, listened, forced)
        if error is not None:
            raise error
    finally:
        await worker.shutdown()
    _check(TASKIQ, tally.count, n, await _pending(client, stream, GROUP))
    await client.delete(stream)
    return Result(TASKIQ, tally.count, elapsed, commands, usec)


RECEIVER_STOP_S = 5.0
"""How long taskiq's receiver gets to stop by itself, once the work is done."""


async def _stop_receiver(worker: Any, listened: anyio.Event, forced: list[bool]) -> None:
    """Wait for taskiq's receiver to stop; if it does not, close its connections.

    About one run in ten on a loaded machine, taskiq 0.13's receiver never finished its
    graceful stop: it cancels the task reading the next delivery (a blocking
    XREADGROUP on the broker's pool) and awaits it inside a shielded scope, and that
    task stayed cancelling on a read that never returned, so the benchmark (and the
    smoke test) hung. Disconnecting the broker's pool ends that read with an error,
    which the receiver re-raises once stopped (``forced`` tells the caller to expect
    it). The stop is after the measured span, and the caller still checks that every
    entry was handled and acked, so nothing measured changes.
    """
    with anyio.move_on_after(RECEIVER_STOP_S):
        await listened.wait()
    if listened.is_set():
        return
    forced.append(True)
    print(f"  taskiq: its receiver did not stop within {RECEIVER_STOP_S:g}s: closing its pool")
    await worker.connection_pool.disconnect()
    with anyio.fail_after(RECEIVER_STOP_S):
        await listened.wait()


async def _listen(receiver: Any, finish: anyio.Event) -> None:
    """``Receiver.listen`` wants an ``asyncio.Event``: bridge it from ``finish``."""
    import asyncio

    stop = asyncio.Event()

    async def relay() -> None:
        await finish.wait()
        stop.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(relay)
        await receiver.listen(stop)
        tg.cancel_scope.cancel()


# -- streaq -----------------------------------------------------------------------------


async def run_streaq(
    client: Any, admin: Any, target: Target, queue: str, n: int, batch: int
) -> Result:
    from streaq import Worker  # type: ignore[import-not-found, unused-ignore]

    tally = Tally(n)

    async def noop(payload: str) -> None:
        tally.hit()

    def make_worker() -> Worker[Any]:
        concurrency = 16  # streaQ's default
        worker = Worker(
            redis_url=target.url,
            queue_name=queue,
            concurrency=concurrency,
            # It reads up to prefetch + concurrency - running entries at once.
            prefetch=max(1, batch - concurrency),
            handle_signals=False,
        )
        worker.task(name="bench_noop", silent=True, ttl=0)(noop)
        return worker

    producer = make_worker()
    async with producer:
        task = producer.registry["bench_noop"]
        for start in range(0, n, PUBLISH_CHUNK):
            await producer.enqueue_many(
                [task.enqueue(payload(i)) for i in range(start, min(n, start + PUBLISH_CHUNK))]
            )

    worker = make_worker()
    worker.burst = True
    before = await start_counting(admin, target)
    gc.collect()
    timeout_s = _timeout_s(n)
    with warnings.catch_warnings():
        # streaQ (7.2) never closes the receive end of the memory stream run_async()
        # feeds its consumers from: anyio warns when it is garbage-collected. Ignore
        # that warning alone, and collect it here rather than in whatever runs next.
        warnings.filterwarnings(
            "ignore", "Unclosed <MemoryObjectReceiveStream", category=ResourceWarning
        )
        t0 = time.perf_counter()
        try:
            with anyio.fail_after(timeout_s):
                await worker.run_async()
        except TimeoutError:
            raise BenchmarkError(
                f"{STREAQ}: not done after {timeout_s:.0f}s (handled {tally.count}/{n} entries)"
            ) from None
        elapsed = time.perf_counter() - t0
        gc.collect()
    commands, usec = stats_delta(before, await command_stats(admin))
    from streaq.constants import REDIS_GROUP  # type: ignore[import-not-found, unused-ignore]

    pending = left = 0
    for priority in worker.priorities:
        stream = worker.stream_key + priority
        if await client.exists(stream):
            pending += await _pending(client, stream, REDIS_GROUP)
            left += int(await client.xlen(stream))
    completed = int(worker.counters["completed"])
    _check(
        STREAQ,
        tally.count,
        n,
        pending,
        f", {left} still in the stream, {completed} completed" if left or completed != n else "",
    )
    return Result(STREAQ, tally.count, elapsed, commands, usec)


# -- the run ----------------------------------------------------------------------------


@dataclass(slots=True)
class PeerRound:
    index: int
    order: tuple[str, ...]
    results: dict[str, Result]

    def rate(self, contender: str) -> float:
        return self.results[contender].rate

    def streamjobs_over(self, contender: str) -> float:
        """streamjobs rate / contender rate: > 1 means streamjobs is faster."""
        return self.rate(STREAMJOBS) / self.rate(contender)

    def over_bare(self, contender: str) -> float:
        """contender rate / bare rate: the share of the bare loop's speed it reaches."""
        return self.rate(contender) / self.rate(BARE)


@dataclass(slots=True)
class PeerSummary:
    entries: int
    batch: int
    contenders: tuple[str, ...]
    rounds: list[PeerRound] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)

    def rates(self, contender: str) -> list[float]:
        return [r.rate(contender) for r in self.rounds]

    def median_rate(self, contender: str) -> float:
        return statistics.median(self.rates(contender))

    def median_streamjobs_over(self, contender: str) -> float:
        return statistics.median(r.streamjobs_over(contender) for r in self.rounds)

    def median_over_bare(self, contender: str) -> float:
        return statistics.median(r.over_bare(contender) for r in self.rounds)

    def commands_per_entry(self, contender: str) -> float:
        total = sum(r.results[contender].commands_total for r in self.rounds)
        return total / (self.entries * len(self.rounds))

    def to_json(self) -> dict[str, Any]:
        return {
            "entries": self.entries,
            "batch": self.batch,
            "payload_bytes": PAYLOAD_BYTES,
            "contenders": list(self.contenders),
            "skipped": self.skipped,
            "versions": peer_versions(self.contenders),
            "rounds": [
                {
                    "round": r.index + 1,
                    "order": list(r.order),
                    "results": {
                        c: {
                            "entries": res.entries,
                            "seconds": res.seconds,
                            "entries_per_s": res.rate,
                            "redis_commands": res.commands_total,
                            "streamjobs_over_contender": r.streamjobs_over(c),
                            "contender_over_bare": r.over_bare(c),
                        }
                        for c, res in r.results.items()
                    },
                }
                for r in self.rounds
            ],
            "median": {
                c: {
                    "entries_per_s": self.median_rate(c),
                    "streamjobs_over_contender": self.median_streamjobs_over(c),
                    "contender_over_bare": self.median_over_bare(c),
                    "redis_commands_per_entry": self.commands_per_entry(c),
                }
                for c in self.contenders
            },
        }


async def _run_one(
    contender: str,
    client: Any,
    admin: Any,
    target: Target,
    prefix: str,
    n: int,
    batch: int,
) -> Result:
    stream = f"{prefix}:{contender}"
    if contender == BARE:
        return await run_bare(client, admin, target, stream, n, batch)
    if contender == STREAMJOBS:
        service = prefix.replace(":", "-")
        return await run_streamjobs(client, admin, target, stream, service, n, batch)
    if contender == STREAMJOBS_GROUP:
        from benchmarks.shared_group import run_group

        service = prefix.replace(":", "-") + "-group"
        return await run_group(client, admin, target, stream, service, n, batch)
    if contender in (FASTSTREAM, FASTSTREAM_BATCH):
        batch_handler = contender == FASTSTREAM_BATCH
        return await run_faststream(
            client, admin, target, stream, n, batch, batch_handler=batch_handler
        )
    if contender == TASKIQ:
        return await run_taskiq(client, admin, target, stream, n, batch)
    if contender == STREAQ:
        return await run_streaq(client, admin, target, stream, n, batch)
    raise ValueError(f"unknown contender {contender!r}")


async def run_benchmark(
    target: Target, entries: int, rounds: int, batch: int, peers: Sequence[str]
) -> PeerSummary:
    skipped: dict[str, str] = {}
    for peer in peers:
        if not installed(peer):
            skipped[peer] = f"package {PEER_MODULES[peer]!r} is not installed"
            print(
                f"note: skipping {peer}: {skipped[peer]} (pip install -e '.[bench]')",
                flush=True,
            )
    contenders = REFERENCES + tuple(p for p in PEERS if p in peers and p not in skipped)
    summary = PeerSummary(entries, batch, contenders, skipped=skipped)
    run_id = uuid.uuid4().hex[:12]
    client = redis.asyncio.Redis.from_url(target.url, decode_responses=False)
    admin = redis.asyncio.Redis.from_url(target.url, decode_responses=True)
    try:
        print(await _describe(admin, target), flush=True)
        versions = ", ".join(f"{d} {v}" for d, v in peer_versions(contenders).items())
        print(f"peers: {versions or 'none'}", flush=True)
        print(
            f"workload: {entries:,} entries of ~{PAYLOAD_BYTES} B, batch {batch}, "
            f"{rounds} round(s), run id {run_id}",
            flush=True,
        )
        if not target.private:
            print("note: shared server: command counts include other clients' commands")
        for index in range(rounds):
            results: dict[str, Result] = {}
            for contender in contenders:
                prefix = f"bench:{run_id}:r{index}"
                results[contender] = await _run_one(
                    contender, client, admin, target, prefix, entries, batch
                )
            rnd = PeerRound(index, contenders, results)
            summary.rounds.append(rnd)
            print(
                f"round {index + 1}/{rounds}: "
                + " | ".join(
                    f"{c} {res.rate:,.0f} entries/s ({res.seconds:.3f} s)"
                    for c, res in results.items()
                ),
                flush=True,
            )
            print(
                "  verified: "
                + ", ".join(f"{c} handled {res.entries}/{entries}" for c, res in results.items()),
                flush=True,
            )
    finally:
        with contextlib.suppress(redis.RedisError, OSError):
            await delete_keys_containing(admin, run_id)
        await client.aclose()
        await admin.aclose()
    print_summary(summary)
    return summary


def print_summary(summary: PeerSummary) -> None:
    rounds = summary.rounds
    print()
    print(
        "| contender | "
        + " | ".join(f"round {r.index + 1} entries/s" for r in rounds)
        + " | median entries/s | streamjobs/contender | contender/bare | Redis cmds/entry |"
    )
    print("|---|" + "---|" * (len(rounds) + 4))
    for c in summary.contenders:
        print(
            f"| {c} | "
            + " | ".join(f"{r.rate(c):,.0f}" for r in rounds)
            + f" | {summary.median_rate(c):,.0f} | {summary.median_streamjobs_over(c):.3f} | "
            f"{summary.median_over_bare(c):.3f} | {summary.commands_per_entry(c):.4f} |"
        )
    print()
    print(
        "streamjobs/contender = streamjobs rate / contender rate (> 1: streamjobs is "
        "faster); contender/bare = contender rate / bare rate; ratios are medians of "
        "the per-round ratios."
    )
    print(f"median ratio streamjobs/bare: {summary.median_over_bare(STREAMJOBS):.3f}")
    print(
        "median ratio streamjobs-group/bare: "
        f"{summary.median_over_bare(STREAMJOBS_GROUP):.3f} (GroupConsumer, a shared group)"
    )
    for c in summary.contenders:
        if c in PEERS:
            print(
                f"median ratio streamjobs/{c}: {summary.median_streamjobs_over(c):.3f}; "
                f"{c}/bare: {summary.median_over_bare(c):.3f}"
            )


def _positive_int(value: str) -> int:
    n = int(value)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {n}")
    return n


def _contenders(value: str) -> list[str]:
    names = [v.strip() for v in value.split(",") if v.strip()]
    unknown = [v for v in names if v not in CONTENDERS]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown contender(s) {', '.join(unknown)}; choose from {', '.join(PEERS)}"
        )
    return names


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.peers",
        description="streamjobs and a bare redis-py loop vs FastStream, taskiq-redis and "
        "streaQ on one hot stream.",
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
    parser.add_argument("--entries", type=_positive_int, default=100_000)
    parser.add_argument("--rounds", type=_positive_int, default=3)
    parser.add_argument("--batch", type=_positive_int, default=100)
    parser.add_argument(
        "--contenders",
        type=_contenders,
        default=list(PEERS),
        help="comma-separated peers to run (default: all of "
        f"{','.join(PEERS)}); {BARE} and {STREAMJOBS} always run",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    with redis_target(args.redis_url, args.use_url) as target:
        summary = anyio.run(
            run_benchmark, target, args.entries, args.rounds, args.batch, args.contenders
        )
    if args.json is not None:
        args.json.write_text(json.dumps(summary.to_json(), indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
