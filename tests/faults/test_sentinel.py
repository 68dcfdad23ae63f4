"""Sentinel for real: ``ClusterMode.NONE`` over a Sentinel-managed client, and the
primary SIGKILLed while streams are owned. The sentinels promote the replica, the
consumers reconnect to it, and every entry is handled or dead-lettered with nothing
left locked or pending (docs/compatibility.md#sentinel)."""

from __future__ import annotations

import gc
import time
import warnings
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from redis import Redis as SyncRedis
from redis.asyncio.sentinel import Sentinel

from streamjobs import ConsumerConfig, Liveness, Message, Producer, RecoveryConfig, StreamConsumer
from streamjobs._keys import Keys
from tests.harness.sentinel import MASTER, SentinelGroup
from tests.integration._helpers import eventually

pytestmark = pytest.mark.anyio


@pytest.fixture
def sentinels(require_redis_server: str) -> Iterator[SentinelGroup]:
    group = SentinelGroup().start()
    try:
        yield group
    finally:
        group.stop()


class Slow(StreamConsumer):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.handled: set[tuple[str, str]] = set()
        self.ended: set[str] = set()

    async def handle(self, message: Message) -> None:
        await anyio.sleep(0.03)  # slow on purpose: streams are owned when the primary dies
        self.handled.add((message.stream, message.fields["n"]))

    async def on_stream_end(self, stream: str) -> None:
        self.ended.add(stream)


# redis-py leaks the socket (and sometimes the Connection object) of a connect to the
# dead primary that is cancelled half-way (collect_leaked_sockets below); on a loaded
# machine the garbage collector can meet them mid-test. Only those two finalizers'
# warnings are ignored, nothing else.
@pytest.mark.filterwarnings(
    r"ignore:Exception ignored in. <function StreamWriter.__del__"
    ":pytest.PytestUnraisableExceptionWarning"
)
@pytest.mark.filterwarnings(
    r"ignore:Exception ignored in. <function AbstractConnection.__del__"
    ":pytest.PytestUnraisableExceptionWarning"
)
@pytest.mark.parametrize("liveness", [Liveness.LOCK, Liveness.SESSION])
async def test_consumers_follow_a_failover_and_lose_nothing(
    sentinels: SentinelGroup, uid: str, liveness: Liveness
) -> None:
    sentinel = Sentinel(sentinels.sentinels, socket_timeout=2)  # type: ignore[no-untyped-call]
    client = sentinel.master_for(MASTER, socket_timeout=5, socket_connect_timeout=2)
    service = f"svc-{uid}"
    keys = Keys(service)
    streams = [f"d:{uid}:{i}" for i in range(6)]
    producer = Producer(client, service=service)
    for stream in streams:
        await producer.add_stream(stream)
        for n in range(40):
            await producer.append(stream, {"n": str(n)})
        await producer.close_stream(stream)
    old_primary = sentinels.primary_port()
    admin = SyncRedis(port=old_primary)
    # All of it on the replica before the primary dies.
    assert admin.execute_command("WAIT", 1, 5000) == 1  # type: ignore[no-untyped-call]
    admin.close()
    config = ConsumerConfig(
        lock_ttl_s=2, read_block_ms=300, max_concurrent_streams=3, liveness=liveness
    )
    recovery = RecoveryConfig(min_idle_s=3, interval_s=1, lease_check_interval_s=0.5)
    consumers = [Slow(client, service=service, config=config, recovery=recovery) for _ in range(2)]
    async with consumers[0], consumers[1]:

        async def owning() -> bool:
            return sum(len(c.owned_streams) for c in consumers) >= 4

        await eventually(owning)
        killed_at = time.monotonic()
        sentinels.primary.kill()
        with anyio.fail_after(30):
            while True:
                try:
                    if sentinels.primary_port() != old_primary:
                        break
                except Exception:
                    pass
                await anyio.sleep(0.2)
        promoted_s = time.monotonic() - killed_at

        async def all_ended() -> bool:
            return set().union(*(c.ended for c in consumers)) == set(streams)

        await eventually(all_ended, timeout_s=90)
        resumed_s = time.monotonic() - killed_at
    handled = set().union(*(c.handled for c in consumers))
    print(f"\nsentinel failover: promoted after {promoted_s:.1f}s, done {resumed_s:.1f}s after")
    dead = await client.xlen(keys.dead_letters) if await client.exists(keys.dead_letters) else 0
    assert dead == 0
    assert handled == {(s, str(n)) for s in streams for n in range(40)}
    assert await client.xlen(keys.assignments) == 0
    for stream in streams:
        assert not await client.exists(keys.lock(stream))
        if await client.exists(stream):
            assert all(g["pending"] == 0 for g in await client.xinfo_groups(stream))
    await client.aclose()
    for sentinel_client in sentinel.sentinels:  # the Sentinel object's own connections
        await sentinel_client.aclose()
    del client, sentinel
    collect_leaked_sockets()


def collect_leaked_sockets() -> None:
    """Collect, here, what redis-py leaks when a connect to the dead primary is
    cancelled half-way (a socket that never got its peer): otherwise the garbage
    collector finds it during some later test, whose strict warning filter then fails
    it for this test's leak. Only ResourceWarnings are silenced, only here."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()
