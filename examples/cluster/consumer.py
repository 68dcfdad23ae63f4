"""A consumer on an OSS Redis Cluster: ClusterMode.OSS with redis.asyncio.RedisCluster.

    python examples/cluster/consumer.py redis://127.0.0.1:7000

The URL names any one node (a *startup node*); the client discovers the others. It
starts one consumer and calls its ``reset_topology()``, which rebuilds its keyspace
subscriptions, one per primary: what an operator does after resharding or a planned
failover (the consumer also does it by itself when the primaries change). Then it
queues six streams, which spread over the primaries (each stream's slot, which its
lock shares, is printed with the primary that owns it), and waits until all have
finished.
"""

from __future__ import annotations

import sys
import uuid
from typing import Any

import anyio
from redis.asyncio.cluster import RedisCluster

from streamjobs import ClusterMode, ConsumerConfig, Message, Producer, StreamConsumer
from streamjobs.testing import redis_for_script

STREAMS, ENTRIES = 6, 3


class Orders(StreamConsumer):
    def __init__(self, redis: Any, **kwargs: Any) -> None:
        super().__init__(redis, **kwargs)
        self.handled = 0
        self.finished = anyio.Semaphore(0)

    async def handle(self, message: Message) -> None:
        self.handled += 1

    async def on_stream_end(self, stream: str) -> None:
        print(f"  {stream} finished")
        self.finished.release()


async def main(url: str) -> int:
    redis = RedisCluster.from_url(url)  # one startup node is enough
    await redis.initialize()
    service = f"cluster-{uuid.uuid4().hex[:8]}"
    print(f"service {service} on a cluster of {len(redis.get_primaries())} primaries")
    streams = [f"{service}:orders:{n}" for n in range(STREAMS)]
    nodes: set[str] = set()
    for stream in streams:
        node = redis.get_node_from_key(stream)  # the primary that owns its slot
        name = node.name if node is not None else "?"
        nodes.add(name)
        print(f"  {stream}: slot {redis.keyslot(stream)} on {name}")
    consumer = Orders(
        redis,
        service=service,
        cluster_mode=ClusterMode.OSS,  # keyspace subscriptions on every primary
        config=ConsumerConfig(finished_stream_ttl_s=0),
    )
    try:
        async with consumer:
            await consumer.reset_topology()  # raises ClusterNotSettled mid-failover
            print("reset_topology(): subscriptions rebuilt on the current primaries")
            producer = Producer(redis, service=service)
            for stream in streams:
                await producer.add_stream(stream)
                for n in range(ENTRIES):
                    await producer.append(stream, {"order": str(n)})
                await producer.close_stream(stream)
            with anyio.fail_after(30):
                for _ in streams:
                    await consumer.finished.acquire()
    finally:
        # Keys live on different nodes: scan every primary, delete one key at a time.
        for key in [k async for k in redis.scan_iter(match=f"*{service}*")]:
            await redis.delete(key)
        await redis.aclose()
    if consumer.handled != STREAMS * ENTRIES:
        print(f"FAILED: handled {consumer.handled} of {STREAMS * ENTRIES} entries")
        return 1
    print(
        f"done: {STREAMS} streams on {len(nodes)} primaries finished, "
        f"{consumer.handled} entries handled"
    )
    return 0


if __name__ == "__main__":
    with redis_for_script(__doc__.splitlines()[0], cluster=True) as url:
        code = anyio.run(main, url)
    sys.exit(code)
