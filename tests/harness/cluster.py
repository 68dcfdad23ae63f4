"""The cluster side of the test harness: where a cluster fixture connects
(:class:`ClusterEndpoint`: a :class:`~streamjobs.testing.LocalCluster` the fixture
started, or an :class:`ExternalCluster` named by ``STREAMJOBS_TEST_CLUSTER_URL``) and
how a test closes its cluster client. The cluster itself is public:
``streamjobs.testing.LocalCluster``.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

from redis.asyncio.cluster import ClusterNode, RedisCluster

from streamjobs.testing import HOST

__all__ = ("ClusterEndpoint", "ExternalCluster", "close_cluster_client")


class ClusterEndpoint(Protocol):
    """What every cluster fixture offers: where to connect."""

    @property
    def url(self) -> str: ...

    @property
    def startup_nodes(self) -> list[tuple[str, int]]: ...


@dataclass(frozen=True, kw_only=True)
class ExternalCluster:
    """A cluster someone else runs (`STREAMJOBS_TEST_CLUSTER_URL`); never modified."""

    url: str

    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        parts = urlsplit(self.url)
        return [(parts.hostname or HOST, parts.port or 6379)]


async def close_cluster_client(client: RedisCluster) -> None:
    """Close ``client`` and any node it orphaned.

    redis-py drops a node from its cache on a topology change even while one of the
    node's connections is in use (a blocking read during a failover, say); that
    connection goes back to the orphaned node later and nothing closes it. Closing
    every ClusterNode still alive keeps ResourceWarnings (errors here) meaningful.
    """
    await client.aclose()
    for obj in gc.get_objects():
        if isinstance(obj, ClusterNode):
            await obj.disconnect()
