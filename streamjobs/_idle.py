"""What a stream with nothing to read sees of its consumer's shared idle wait: the
blocking reads of a standalone server (``_waiter.Waiter``) or the keyspace events of an
OSS cluster (``_cluster_waiter.ClusterWaiter``), for either consumer kind."""

from __future__ import annotations

import asyncio
from typing import Protocol


class IdleWait(Protocol):
    """The shared idle wait, as one waiting stream uses it."""

    @property
    def usable(self) -> bool:
        """Streams may wait here now (a cluster primary may refuse keyspace events)."""

    async def wait(
        self,
        stream: str,
        after_id: str,
        timeout_s: float,
        woken: asyncio.Future[None] | None = None,
    ) -> None:
        """Return once ``stream`` has an entry newer than ``after_id``, after
        ``timeout_s``, or once ``woken`` is resolved (the stream's owner ends the wait)."""

    def idle_timeout_s(self, stream: str, fallback_s: float) -> float:
        """How long ``stream`` may wait here before reading again by itself."""
