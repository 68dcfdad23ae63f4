"""Repro of ``left_behind_keys`` (a lease member): an owner stalled between taking a lock
and recording its lease records it after its job was recovered and finished elsewhere.

Consumers A and B (threads of this process) run with ``Liveness.SESSION``. A reads the
assignment and takes the stream's lock; its event loop then blocks for ``STALL_S``
right before the call that adds the assignment's lease member (a stand-in for a GC
pause, a frozen VM or SIGSTOP at that point). A's session expires meanwhile; B's
session sweep re-queues the assignment, B takes over the dead session's lock, handles
the stream and finishes the copy (which removes the copy's lease member). Then A wakes
up and adds the lease member of the original assignment, which no longer exists. In
session mode that member's deadline is the long session lock TTL (10 minutes here), so
nothing sweeps it before then: once every stream has finished, the lease index still
holds it, and if the consumers stop, it stays.

    .venv/bin/python -m tests.soak.repro.stale_lease

Prints the lease index at the end and exits 1 if it holds a member.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

import anyio
import anyio.to_thread
from redis import Redis as SyncRedis
from redis.asyncio import Redis

from streamjobs import ConsumerConfig, Liveness, Message, Producer, StreamConsumer
from streamjobs._keys import Keys
from streamjobs.testing import RedisServer

SERVICE = "repro"
STREAM = "s"
TTL_S = 1.0
STALL_S = 4.0


class Quiet(StreamConsumer):
    async def handle(self, message: Message) -> None:
        print(f"{self.consumer_name}: handle {message.id}")


class StallBeforeLease(Redis):
    """Blocks the event loop once, before the script call that adds a new lease."""

    stalling = threading.Event()
    recorded = threading.Event()  # the stalled call went through

    async def evalsha(self, sha: Any, numkeys: Any, *keys_and_args: Any) -> Any:
        args = keys_and_args[int(numkeys) :]
        if args and args[0] in ("add", b"add") and not StallBeforeLease.stalling.is_set():
            StallBeforeLease.stalling.set()
            print(f"A: lock taken; stalling {STALL_S:g}s before recording the lease")
            time.sleep(STALL_S)  # noqa: ASYNC251 - the point: the whole consumer stalls
            print("A: awake, recording the lease")
            try:
                return await super().evalsha(sha, numkeys, *keys_and_args)
            finally:
                StallBeforeLease.recorded.set()
        return await super().evalsha(sha, numkeys, *keys_and_args)


def run(name: str, url: str, client_class: type[Redis], stop: threading.Event) -> None:
    async def main() -> None:
        client = client_class.from_url(url)
        config = ConsumerConfig(lock_ttl_s=TTL_S, read_block_ms=100, liveness=Liveness.SESSION)
        consumer = Quiet(client, service=SERVICE, consumer_name=name, config=config)
        async with consumer:
            await anyio.to_thread.run_sync(stop.wait)
        await client.aclose()

    anyio.run(main)


async def produce(url: str) -> None:
    client = Redis.from_url(url)
    producer = Producer(client, service=SERVICE)
    await producer.add_stream(STREAM)
    for n in range(3):
        await producer.append(STREAM, {"n": str(n)})
    await producer.close_stream(STREAM)
    await client.aclose()


def main() -> int:
    keys = Keys(SERVICE)
    stop = threading.Event()
    with RedisServer() as server:
        sync: Any = SyncRedis.from_url(server.url, decode_responses=True)
        threads = [threading.Thread(target=run, args=("A", server.url, StallBeforeLease, stop))]
        threads[0].start()
        try:
            anyio.run(produce, server.url)
            if not StallBeforeLease.stalling.wait(15):
                print("A never took the lock")
                return 2
            threads.append(threading.Thread(target=run, args=("B", server.url, Redis, stop)))
            threads[1].start()
            deadline = time.monotonic() + 30
            while sync.xlen(keys.assignments) or sync.exists(keys.lock(STREAM)):
                if time.monotonic() > deadline:
                    print("the stream did not finish within 30 s")
                    return 2
                time.sleep(0.05)
            if not StallBeforeLease.recorded.wait(30):  # A wakes up and records its lease
                print("A did not wake up within 30 s")
                return 2
            leases = sync.zrange(keys.leases, 0, -1, withscores=True)
            now_ms = int(sync.time()[0]) * 1000
            print(
                "assignments left:",
                sync.xlen(keys.assignments),
                "; lock:",
                sync.get(keys.lock(STREAM)),
            )
            for member, score in leases:
                exists = bool(sync.xrange(keys.assignments, member, member))
                print(
                    f"lease member {member}: deadline in {(score - now_ms) / 1000:.0f}s, "
                    f"assignment {'exists' if exists else 'gone'}"
                )
            if leases:
                print("LEAK: a lease member outlives its finished assignment")
                return 1
            print("OK: the lease index is empty")
            return 0
        finally:
            stop.set()
            for thread in threads:
                thread.join()
            sync.close()


if __name__ == "__main__":
    sys.exit(main())
