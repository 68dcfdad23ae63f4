"""Repro of `left_behind_data`: the release after ``finish.lua`` never succeeds.

A consumer finishes a stream (``finish(stream)`` in ``handle()``) and, before the
handler returns, the data stream's primary is killed. ``finish.lua`` runs on the
service's node and succeeds; ``release.lua`` on the data stream's node fails until the
replica takes over, by which time a lock TTL shorter than the failover has expired, so
the release is refused. The consumer still reports ``on_stream_end``; the data stream
keeps every entry of its last batch pending and gets no retention TTL.

    .venv/bin/python -m soak.repro.finish_release_failover          # TTL 3 s: leaks
    TTL=8 .venv/bin/python -m soak.repro.finish_release_failover    # TTL 8 s: clean

Run from the repository root (it uses tests/harness/cluster.py).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

import anyio
import anyio.to_thread
from redis.asyncio.cluster import ClusterNode, RedisCluster

from streamjobs import (
    ClusterMode,
    ConsumerConfig,
    Message,
    Producer,
    RecoveryConfig,
    StreamConsumer,
)
from streamjobs._keys import Keys
from tests.harness.cluster import LocalCluster

SERVICE = "repro"
ENTRIES = 30


def node_port(rc: RedisCluster, key: str) -> int:
    node = rc.get_node_from_key(key)
    assert node is not None
    return int(node.port)


def stream_off_lbs_node(rc: RedisCluster) -> str:
    """A data stream name whose slot is not on the assignment stream's node."""
    lbs_port = node_port(rc, Keys(SERVICE).assignments)
    i = 0
    while node_port(rc, f"d:{i}") == lbs_port:
        i += 1
    return f"d:{i}"


class Finisher(StreamConsumer):
    def __init__(self, *args: Any, cluster: LocalCluster, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cluster = cluster
        self.events: list[str] = []
        self.done = anyio.Event()  # set by on_stream_end / on_stream_lost

    def note(self, text: str) -> None:
        self.events.append(f"{time.monotonic():.1f} {text}")

    async def handle(self, message: Message) -> None:
        if message.fields.get("n") == str(ENTRIES - 1):
            # The last entry: finish after it, and kill the data stream's primary
            # before returning, so the release meets the failover.
            self.finish(message.stream)
            port = node_port(self.redis, message.stream)
            self.note(f"killing primary {port} of {message.stream}")
            await anyio.to_thread.run_sync(self.cluster.kill_node, port)

    async def on_stream_start(self, stream: str, info: Mapping[str, Any]) -> None:
        self.note(f"on_stream_start({stream})")

    async def on_stream_end(self, stream: str) -> None:
        self.note(f"on_stream_end({stream})")
        self.done.set()

    async def on_stream_lost(self, stream: str) -> None:
        self.note(f"on_stream_lost({stream})")
        self.done.set()


async def main() -> None:
    ttl = float(os.environ.get("TTL", "3"))
    with LocalCluster() as cluster:
        rc = RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in cluster.startup_nodes])
        await rc.initialize()
        stream = stream_off_lbs_node(rc)
        producer = Producer(rc, service=SERVICE)
        await producer.add_stream(stream)
        for n in range(ENTRIES):
            await producer.append(stream, {"n": str(n)})
        consumer = Finisher(
            rc,
            service=SERVICE,
            cluster_mode=ClusterMode.OSS,
            consumer_name="c1",
            config=ConsumerConfig(lock_ttl_s=ttl, read_batch_size=100, read_block_ms=100),
            recovery=RecoveryConfig(min_idle_s=2 * ttl, interval_s=2),
            cluster=cluster,
        )
        async with consumer:
            with anyio.move_on_after(30):
                await consumer.done.wait()
            await anyio.to_thread.run_sync(cluster.wait_settled, 30.0)
            await anyio.sleep(5)  # the lock TTL is long gone; recovery had its chance
        keys = Keys(SERVICE)
        print(f"lock_ttl_s={ttl}")
        print("consumer events:", consumer.events)
        print("assignments left (XLEN lbs):", await rc.xlen(keys.assignments))
        print("lock exists:", await rc.exists(keys.lock(stream)))
        print("data stream pending entries:", (await rc.xpending(stream, SERVICE))["pending"])
        print("data stream PTTL (ms; -1 = no retention):", await rc.pttl(stream))
        await rc.aclose()


if __name__ == "__main__":
    anyio.run(main)
