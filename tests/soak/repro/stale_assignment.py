"""Repro of `rerun_finished`: a stale assignment is run after its re-queued copy.

Consumer A (a thread of this process) uses a client whose ``XREADGROUP`` blocks A's
event loop for ``STALL_S`` once it returned an assignment: a stand-in for a GC pause, a
VM freeze or SIGSTOP between intake and lock acquisition. Consumer B (a ``streamjobs
worker`` process) is live: its reconciliation scan finds the assignment pending, idle
past ``min_idle_s`` and without a lock, re-queues it, reads the copy and finishes the
stream. Then A wakes up, takes the lock for the stale assignment and starts the job
again: it clears the finished stream's retention TTL and waits for entries forever,
holding its lock; nothing is left pending, so nothing will ever recover it.

    .venv/bin/python -m tests.soak.repro.stale_assignment

Run from the repository root (B runs ``tests.faults.workers:RecordingWorker``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
from redis import Redis as SyncRedis
from redis import ResponseError
from redis.asyncio import Redis

from streamjobs import ConsumerConfig, Message, Producer, RecoveryConfig, StreamConsumer
from streamjobs._keys import Keys
from streamjobs.testing import RedisServer, WorkerFleet

ROOT = Path(__file__).resolve().parents[3]
SERVICE = "repro"
STREAM = "d:1"
STALL_S = 4.0
TTL_S = 1.0


class StallingRedis(Redis):
    """Blocks the event loop once, right after the first XREADGROUP that returned data."""

    stalled = False

    async def xreadgroup(self, *args: Any, **kwargs: Any) -> Any:
        reply = await super().xreadgroup(*args, **kwargs)
        if reply and not StallingRedis.stalled:
            StallingRedis.stalled = True
            print(f"A: read an assignment; stalling {STALL_S:g}s (event loop blocked)")
            time.sleep(STALL_S)  # noqa: ASYNC251 - the point: the whole consumer stalls
            print("A: awake")
        return reply


class Stalled(StreamConsumer):
    async def handle(self, message: Message) -> None:
        print(f"A: handle {message.id} {dict(message.fields)}")

    async def on_stream_start(self, stream: str, info: Mapping[str, Any]) -> None:
        print(f"A: on_stream_start({stream})")

    async def on_stream_end(self, stream: str) -> None:
        print(f"A: on_stream_end({stream})")


def run_a(url: str, stop: threading.Event) -> None:
    async def main() -> None:
        client = StallingRedis.from_url(url)
        consumer = Stalled(
            client,
            service=SERVICE,
            consumer_name="A",
            config=ConsumerConfig(lock_ttl_s=TTL_S, read_block_ms=100),
            recovery=RecoveryConfig(min_idle_s=1.5 * TTL_S, interval_s=1.0),
        )
        async with consumer:
            await anyio.to_thread.run_sync(stop.wait)
        await client.aclose()

    anyio.run(main)


async def produce(url: str) -> None:
    client = Redis.from_url(url)
    producer = Producer(client, service=SERVICE)
    await producer.add_stream(STREAM)
    for n in range(5):
        await producer.append(STREAM, {"n": str(n)})
    await producer.close_stream(STREAM)
    await client.aclose()


def main() -> None:
    keys = Keys(SERVICE)
    with RedisServer() as server:
        sync: Any = SyncRedis.from_url(server.url, decode_responses=True)
        anyio.run(produce, server.url)
        stop = threading.Event()
        thread = threading.Thread(target=run_a, args=(server.url, stop))
        thread.start()
        try:
            while not pending(sync, keys):
                time.sleep(0.01)
            print("main: A has read the assignment (pending, no lock yet); starting B")
            args = ["--lock-ttl", str(TTL_S), "--min-idle", str(1.5 * TTL_S)]
            args += ["--scan-interval", "1"]
            target = "tests.faults.workers:RecordingWorker"
            fleet = WorkerFleet(server.url, SERVICE, target, args, pythonpath=[ROOT], cwd=ROOT)
            with fleet:
                fleet.start("B")
                time.sleep(15)
                print("--- 15 s later ---")
                print("B handled:", len(sync.lrange(f"faults:{SERVICE}:log", 0, -1)), "entries")
                print("assignments in the LBS:", sync.xrange(keys.assignments))
                print("pending assignments:", pending(sync, keys))
                print("lock holder:", sync.get(keys.lock(STREAM)))
                print("data stream PTTL (ms; -1 = no retention):", sync.pttl(STREAM))
                fleet.stop_all()
                print(f"--- B's log ---\n{fleet.workers[0].log_tail(30)}")
        finally:
            stop.set()
            thread.join()
            sync.close()


def pending(sync: Any, keys: Keys) -> int:
    """Pending assignments (0 until a consumer created the group)."""
    try:
        return int(sync.xpending(keys.assignments, SERVICE)["pending"])
    except ResponseError:  # NOGROUP
        return 0


if __name__ == "__main__":
    main()
