"""The reconciliation scan is paced: one consumer per service per interval holds the
scan lease and pages through the pending list within a time budget, resuming from a
cursor kept in Redis, so a long pending list costs a bounded amount per interval."""

from __future__ import annotations

from typing import Any

import pytest

from streamjobs import ClusterMode, ConsumerConfig, NullRecorder, Producer, RecoveryConfig
from streamjobs._keys import Keys
from streamjobs._recovery import Recoverer
from streamjobs._recovery_loops import RecoveryLoops
from streamjobs._redis import Gateway

from ._helpers import eventually

pytestmark = pytest.mark.anyio


def loops_of(redis: Any, gw: Gateway, service: str, name: str, **recovery: Any) -> RecoveryLoops:
    metrics = NullRecorder()
    return RecoveryLoops(
        redis,
        gw,
        Recoverer(gw, max_retries=3, metrics=metrics, service=service),
        recovery=RecoveryConfig(min_idle_s=0.001, **recovery),
        consumer=ConsumerConfig(),
        cluster_mode=ClusterMode.PROXY,
        metrics=metrics,
        name=name,
    )


async def test_one_consumer_scans_per_interval_and_the_next_pass_goes_on(
    redis: Any, service: str, uid: str
) -> None:
    keys = Keys(service)
    gw = Gateway(redis, keys)
    await gw.assignments.ensure_group()
    producer = Producer(redis, service=service)
    streams = [f"data:{uid}:{i}" for i in range(250)]
    for s in streams:
        await producer.add_stream(s)
    delivered = await redis.xreadgroup(service, "owner", {keys.assignments: ">"}, count=250)
    ids = [i.decode() for i, _ in delivered[0][1]]
    # Every owner is alive (a lock, and a lease far in the future), but one, at
    # position 150. (A lease this far ahead is a session-mode one: the scan asks the
    # lock about it.)
    live = [i for n, i in enumerate(ids) if n != 150]
    await gw.streams.record_leases(live, 3_600_000, new=True)
    for n, s in enumerate(streams):
        if n != 150:
            await redis.set(keys.lock(s), "owner:1", px=3_600_000)

    async def all_idle() -> bool:  # XPENDING IDLE counts whole milliseconds
        page = await redis.xpending_range(keys.assignments, service, "-", "+", 300, idle=2)
        return len(page) == 250

    await eventually(all_idle)
    # A budget so small that each pass reads one page of 100.
    a = loops_of(redis, gw, service, "a", batch_size=100, scan_budget_s=1e-6, interval_s=60)
    b = loops_of(redis, gw, service, "b", batch_size=100, scan_budget_s=1e-6, interval_s=60)
    assert await a.scan_pass() == 1
    assert (await redis.get(keys.scan_cursor)).decode() == f"({ids[99]}"
    assert await b.scan_pass() is None, "two consumers scanned in one interval"
    assert 0 < await redis.pttl(keys.scan_lease) <= 60_000
    await redis.delete(keys.scan_lease)  # the interval is over
    assert await b.scan_pass() == 1  # b goes on where a stopped
    assert (await redis.get(keys.scan_cursor)).decode() == f"({ids[199]}"
    pending = {
        p["message_id"].decode()
        for p in await redis.xpending_range(keys.assignments, service, "-", "+", 300)
    }
    assert ids[150] not in pending, "the dead owner's assignment was not recovered"
    assert len(pending) == 249
    await redis.delete(keys.scan_lease)
    assert await a.scan_pass() == 1  # the last, short page: back to the start
    assert (await redis.get(keys.scan_cursor)).decode() == "-"


async def test_a_pass_stops_at_the_end_of_the_pending_list_within_its_budget(
    redis: Any, service: str, uid: str
) -> None:
    keys = Keys(service)
    gw = Gateway(redis, keys)
    await gw.assignments.ensure_group()
    producer = Producer(redis, service=service)
    for i in range(30):
        await producer.add_stream(f"data:{uid}:{i}")
        await redis.set(keys.lock(f"data:{uid}:{i}"), "owner:1", px=3_600_000)  # alive
    delivered = await redis.xreadgroup(service, "owner", {keys.assignments: ">"}, count=30)
    await gw.streams.record_leases([i.decode() for i, _ in delivered[0][1]], 3_600_000, new=True)

    async def all_idle() -> bool:  # XPENDING IDLE counts whole milliseconds
        page = await redis.xpending_range(keys.assignments, service, "-", "+", 50, idle=2)
        return len(page) == 30

    await eventually(all_idle)
    loops = loops_of(redis, gw, service, "a", batch_size=10, scan_budget_s=60, interval_s=60)
    # Three full pages, then an empty one that ends the round: the cursor restarts.
    assert await loops.scan_pass() == 4
    assert (await redis.get(keys.scan_cursor)).decode() == "-"
