"""Producer calls on a real local OSS cluster, through clients nobody initialized."""

from __future__ import annotations

import anyio
import pytest
from redis.asyncio.cluster import ClusterNode, RedisCluster

from streamjobs import Producer, StreamJobsError
from streamjobs._keys import Keys
from streamjobs.testing import LocalCluster
from tests.harness.cluster import ClusterEndpoint

pytestmark = pytest.mark.anyio

WAVES = 20
CONCURRENT = 50


def uninitialized_client(cluster: ClusterEndpoint) -> RedisCluster:
    """A ``RedisCluster`` as a user makes one: no ``initialize()`` before the first command."""
    if isinstance(cluster, LocalCluster):
        return RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in cluster.startup_nodes])
    return RedisCluster.from_url(cluster.url)


async def test_concurrent_add_stream_on_fresh_cluster_clients_never_fails(
    redis_cluster: ClusterEndpoint, cluster_client: RedisCluster, service: str, uid: str
) -> None:
    """Issue 21: with no fault, 50 concurrent ``add_stream`` calls on a fresh client.

    redis-py routed the first commands of an uninitialized client to random primaries;
    every 5th MOVED made it close every connection, in use or not, and a call whose
    connection was still being opened failed with ``AttributeError`` (about 2 calls a
    wave). The gateway now initializes the client before its first command.
    """
    failures: list[str] = []

    async def add(producer: Producer, name: str) -> None:
        try:
            await producer.add_stream(name)
        except StreamJobsError as exc:
            failures.append(repr(exc))

    for wave in range(WAVES):
        client = uninitialized_client(redis_cluster)
        producer = Producer(client, service=service)
        try:
            async with anyio.create_task_group() as tg:
                for i in range(CONCURRENT):
                    tg.start_soon(add, producer, f"{uid}-{wave}-{i}")
        finally:
            await client.aclose()
    assert failures == [], f"{len(failures)} of {WAVES * CONCURRENT} calls failed: {failures[:3]}"
    assert await cluster_client.xlen(Keys(service).assignments) == WAVES * CONCURRENT
