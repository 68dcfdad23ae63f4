"""What a dead consumer leaves behind, against real Redis: its assignment re-queued
with a log line naming it, its name pruned from the group once idle (unless it holds
work), and a scan page that goes on past an entry that cannot be recovered."""

from __future__ import annotations

import logging

import pytest
from redis.asyncio import Redis as AsyncRedis

from streamjobs import ClusterMode, ConsumerConfig, NullRecorder, Producer, RecoveryConfig
from streamjobs._keys import Keys
from streamjobs._recovery import Recoverer
from streamjobs._recovery_loops import RecoveryLoops
from streamjobs._redis import Gateway
from streamjobs.metrics import RequeueOutcome

from ._helpers import eventually

pytestmark = pytest.mark.anyio


async def test_requeue_log_names_the_consumer_that_is_gone(
    redis: AsyncRedis, service: str, uid: str, caplog: pytest.LogCaptureFixture
) -> None:
    keys = Keys(service)
    gw = Gateway(redis, keys)
    await gw.assignments.ensure_group()
    aid = await Producer(redis, service=service).add_stream(f"data:{uid}")
    await redis.xreadgroup(service, f"ghost-{uid}", {keys.assignments: ">"}, count=1)
    recoverer = Recoverer(gw, max_retries=3, metrics=NullRecorder(), service=service)
    with caplog.at_level(logging.INFO, logger="streamjobs._recovery"):
        assert await recoverer.recover(aid) is RequeueOutcome.REQUEUED
    [line] = [r.getMessage() for r in caplog.records if "re-queued" in r.getMessage()]
    assert f"its owner 'ghost-{uid}' is gone" in line


async def test_consumer_names_that_are_gone_are_pruned_and_live_ones_kept(
    redis: AsyncRedis, service: str, uid: str
) -> None:
    keys = Keys(service)
    gw = Gateway(redis, keys)
    await gw.assignments.ensure_group()
    stream = f"data:{uid}"
    await Producer(redis, service=service).add_stream(stream)
    await redis.xreadgroup(service, "holds-work", {keys.assignments: ">"}, count=1)
    for name in ("dead-1", "dead-2", "me"):
        await redis.xgroup_createconsumer(keys.assignments, service, name)

    async def names() -> set[str]:
        return {c["name"].decode() for c in await redis.xinfo_consumers(keys.assignments, service)}

    assert await gw.liveness.prune_consumers(60_000, "me") == []  # nobody idle for a minute yet
    pruned = await gw.liveness.prune_consumers(0, "me")
    assert sorted(pruned) == ["dead-1", "dead-2"]
    assert await names() == {"holds-work", "me"}  # pending work and ourselves stay
    assert (await redis.xpending(keys.assignments, service))["pending"] == 1


async def test_one_unrecoverable_entry_does_not_stop_the_scan_page(
    redis: AsyncRedis, service: str, uid: str
) -> None:
    keys = Keys(service)
    gw = Gateway(redis, keys)
    await gw.assignments.ensure_group()
    poison = (await redis.xadd(keys.assignments, {"info": "{}"})).decode()  # unparseable
    await Producer(redis, service=service).add_stream(f"data:{uid}")
    await redis.xreadgroup(service, "ghost", {keys.assignments: ">"}, count=2)
    await redis.set(keys.dead_letters, "not a stream")  # the poison cannot be moved there
    errors: list[str] = []

    class Errors(NullRecorder):
        def loop_error(self, service: str, loop: str) -> None:
            errors.append(loop)

    metrics = Errors()
    loops = RecoveryLoops(
        redis,
        gw,
        Recoverer(gw, max_retries=3, metrics=metrics, service=service),
        recovery=RecoveryConfig(min_idle_s=0.001),
        consumer=ConsumerConfig(),
        cluster_mode=ClusterMode.PROXY,
        metrics=metrics,
    )

    async def both_idle() -> bool:  # XPENDING IDLE counts whole milliseconds
        page = await redis.xpending_range(keys.assignments, service, "-", "+", 10, idle=2)
        return len(page) == 2

    await eventually(both_idle)
    assert (await loops.scan_once())[0] == 2
    assert errors == ["recover"]
    pending = await redis.xpending_range(keys.assignments, service, "-", "+", 10)
    assert [p["message_id"].decode() for p in pending] == [poison]  # still there, not lost
    [(_, requeued)] = [
        (i, f) for i, f in await redis.xrange(keys.assignments) if i.decode() != poison
    ]
    assert requeued[b"_retry_count"] == b"1"  # the entry behind it was recovered
