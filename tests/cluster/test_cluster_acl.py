"""The documented least-privilege consumer, on a real 3 + 3 cluster: the users of
docs/operations.md plus its cluster additions, set on every node."""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster

from streamjobs import ClusterMode, ConsumerConfig, Producer, RecoveryConfig
from streamjobs._keys import Keys
from tests.integration._helpers import eventually
from tests.integration.test_acl import PASSWORD, Refusing, documented_acl

pytestmark = pytest.mark.anyio

DOC = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def cluster_additions() -> list[str]:
    text = " ".join(DOC.read_text(encoding="utf-8").split())
    found = re.search(r"On an OSS cluster\*\* add `([^`]+)`", text)
    assert found, "docs/operations.md lost its cluster ACL additions"
    return found.group(1).split()


async def test_the_documented_consumer_runs_on_a_cluster_and_is_refused_nothing(
    cluster_client: RedisCluster, service: str
) -> None:
    user = f"sj-{uuid.uuid4().hex[:8]}"
    acl = [*documented_acl("streamjobs-consumer"), *cluster_additions()]
    nodes = [ClusterNode(n.host, n.port) for n in cluster_client.get_nodes()]
    admins: list[Any] = [Redis(host=n.host, port=n.port) for n in nodes]
    for admin in admins:  # ACLs are per node: every one of them, replicas included
        await admin.execute_command("ACL", "SETUSER", user, "reset", *acl)
    client = RedisCluster(startup_nodes=nodes, username=user, password=PASSWORD)
    try:
        await client.initialize()
        keys = Keys(service)
        producer = Producer(cluster_client, service=service)
        streams = [f"data:{service}:{i}" for i in range(6)]  # spread over the primaries
        for s in streams:
            await producer.add_stream(s)
            await producer.append(s, {"n": "0"})
            await producer.append(s, {"n": "bad"})
            await producer.close_stream(s)
        consumer = Refusing(
            client,
            service=service,
            config=ConsumerConfig(lock_ttl_s=2, read_block_ms=50),
            recovery=RecoveryConfig(min_idle_s=3, interval_s=1),
            cluster_mode=ClusterMode.OSS,
        )
        async with consumer:

            async def all_ended() -> bool:
                return sorted(consumer.ended) == sorted(streams)

            await eventually(all_ended, timeout_s=30)
        assert await cluster_client.xlen(keys.dead_letters) == len(streams)
        refused = [
            entry
            for admin in admins
            for entry in await admin.execute_command("ACL", "LOG")
            if user.encode() in entry
        ]
        assert refused == [], refused
    finally:
        await client.aclose()
        for admin in admins:
            await admin.execute_command("ACL", "DELUSER", user)
            await admin.aclose()
