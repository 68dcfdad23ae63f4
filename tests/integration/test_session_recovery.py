"""Recovery of dead sessions (``Liveness.SESSION``), against real Redis: a failed
recovery keeps the dead session for the next sweep, a dead session's lock goes with its
assignment (and only while it is still that session's), the scan does not take a dead
session's far-off lease for a live one, a late lease is not recorded, and a live
session's lock is alive for another service too."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from redis.asyncio import Redis as AsyncRedis

from streamjobs import ClusterMode, Message, Producer, RecoveryConfig
from streamjobs._keys import Keys
from streamjobs._recovery import Recoverer
from streamjobs._recovery_loops import RecoveryLoops
from streamjobs._redis import Gateway
from streamjobs._redis._assignments import AssignmentCommands
from streamjobs._session import member, session_token
from streamjobs.exceptions import RedisUnavailable
from streamjobs.metrics import NullRecorder, RequeueOutcome
from tests.harness.plugin import ConsumerFactory

from ._helpers import SESSION, Recorder, eventually, true

pytestmark = pytest.mark.anyio


async def _strand_with_dead_session(
    redis: AsyncRedis, service: str, uid: str, incarnation: str
) -> tuple[str, str, str]:
    """An assignment read by ``ghost-<uid>`` long ago (idle 60 s), whose stream's lock
    names ghost's dead session: (stream, assignment id, ghost)."""
    keys = Keys(service)
    stream = f"d:{uid}"
    aid = await Producer(redis, service=service).add_stream(stream)
    ghost = f"ghost-{uid}"
    await redis.xreadgroup(service, ghost, {keys.assignments: ">"}, count=1)
    await redis.xclaim(keys.assignments, service, ghost, 0, [aid], idle=60_000)
    await redis.set(keys.lock(stream), session_token(incarnation, ghost, service), px=600_000)
    return stream, aid, ghost


def _loops(redis: AsyncRedis, gw: Gateway, service: str, **recovery: Any) -> RecoveryLoops:
    """Recovery loops of a session-mode consumer, without subscriptions."""
    metrics = NullRecorder()
    return RecoveryLoops(
        redis,
        gw,
        Recoverer(gw, max_retries=3, metrics=metrics, service=service),
        recovery=RecoveryConfig(**recovery),
        consumer=SESSION,
        cluster_mode=ClusterMode.PROXY,
        metrics=metrics,
    )


class _FailingRequeue(AssignmentCommands):
    """Real Redis, but the first ``requeue`` fails as a failover would make it."""

    failures = 1

    async def requeue(self, *args: Any, **kwargs: Any) -> str | None:
        if self.failures:
            self.failures -= 1
            raise RedisUnavailable("injected: connection lost")
        return await super().requeue(*args, **kwargs)


async def test_a_failed_recovery_keeps_the_dead_session_for_the_next_sweep(
    redis: AsyncRedis, service: str, uid: str
) -> None:
    keys = Keys(service)
    gw = Gateway(redis, keys)
    failing = gw.assignments = _FailingRequeue(gw)
    await gw.assignments.ensure_group()
    incarnation = "a" * 16
    # Read long enough ago to be recovered at once (the sweep leaves fresh ones).
    _, _, ghost = await _strand_with_dead_session(redis, service, uid, incarnation)
    await redis.zadd(keys.sessions, {member(incarnation, ghost): 1})
    loops = _loops(redis, gw, service)
    await loops.sweep_once()
    assert failing.failures == 0, "the injected failure was not met"
    assert await redis.zscore(keys.sessions, member(incarnation, ghost)) is not None, (
        "the dead session was forgotten although its assignment was not recovered"
    )

    async def recovered() -> bool:
        await loops.sweep_once()
        pending: int = (await redis.xpending(keys.assignments, service))["pending"]
        return pending == 0

    # The member comes due again after the re-check delay (half a lock TTL).
    await eventually(recovered, timeout_s=10)
    [(_, fields)] = list(await redis.xrange(keys.assignments) or [])
    assert fields[b"_retry_count"] == b"1"
    assert await redis.zscore(keys.sessions, member(incarnation, ghost)) is None


@pytest.mark.parametrize("retry_count", [0, 3], ids=["requeued", "dead_lettered"])
async def test_recovery_removes_the_lock_of_a_dead_session(
    redis: AsyncRedis, service: str, uid: str, retry_count: int
) -> None:
    """A dead session's lock has a long TTL (10 minutes or more): whatever moves its
    assignment on removes it, so a poison stream that ends in the DLQ leaves no lock."""
    keys = Keys(service)
    gw = Gateway(redis, keys)
    await gw.assignments.ensure_group()
    stream = f"d:{uid}"
    aid = (
        await redis.xadd(
            keys.assignments, {"stream": stream, "info": "{}", "_retry_count": retry_count}
        )
    ).decode()
    ghost = f"ghost-{uid}"
    await redis.xreadgroup(service, ghost, {keys.assignments: ">"}, count=1)
    dead = session_token("b" * 16, ghost, service)
    await redis.set(keys.lock(stream), dead, px=600_000)
    recoverer = Recoverer(gw, max_retries=3, metrics=NullRecorder(), service=service)
    outcome = await recoverer.recover(aid)
    expected = RequeueOutcome.REQUEUED if retry_count == 0 else RequeueOutcome.DEAD_LETTERED
    assert outcome is expected
    assert await redis.exists(keys.lock(stream)) == 0, "the dead session's lock was left"


async def test_recovery_leaves_a_lock_someone_took_meanwhile(
    redis: AsyncRedis, service: str, uid: str
) -> None:
    """The removal compares the token: a lock that changed hands is not touched."""
    keys = Keys(service)
    stream = f"d:{uid}"
    await redis.set(keys.lock(stream), "new-owner:1", px=600_000)
    gw = Gateway(redis, keys)
    recoverer = Recoverer(gw, max_retries=3, metrics=NullRecorder(), service=service)
    await recoverer._drop_dead_lock(stream, session_token("c" * 16, "ghost", service))
    assert await redis.get(keys.lock(stream)) == b"new-owner:1"


async def test_the_scan_recovers_a_dead_session_whose_lease_lies_far_ahead(
    redis: AsyncRedis, service: str, uid: str
) -> None:
    """Under SESSION a lease runs to the long lock TTL (ten minutes or more): the scan
    must not take it for a live lease, or a dead session's assignment whose index entry
    is gone waits that long (found by the model test)."""
    keys = Keys(service)
    gw = Gateway(redis, keys)
    await gw.assignments.ensure_group()
    stream, aid, _ = await _strand_with_dead_session(redis, service, uid, "d" * 16)
    now_ms = await gw.assignments.server_time_ms()
    await redis.zadd(keys.leases, {aid: now_ms + 600_000})
    loops = _loops(redis, gw, service, min_idle_s=15)
    assert (await loops.scan_once("-"))[0] == 1
    assert (await redis.xpending(keys.assignments, service))["pending"] == 0
    [(_, fields)] = list(await redis.xrange(keys.assignments) or [])
    assert fields[b"_retry_count"] == b"1"
    assert await redis.exists(keys.lock(stream)) == 0


async def test_a_lease_recorded_after_the_assignment_finished_is_not_added(
    redis: AsyncRedis, service: str, uid: str
) -> None:
    """An owner stalled between its lock and recording the lease records it after its
    assignment was recovered and finished elsewhere: nothing would remove that member
    before its deadline (ten minutes under SESSION)."""
    keys = Keys(service)
    gw = Gateway(redis, keys)
    await gw.assignments.ensure_group()
    producer = Producer(redis, service=service)
    done = await producer.add_stream(f"d:{uid}:done")
    live = await producer.add_stream(f"d:{uid}:live")
    await redis.xreadgroup(service, "owner", {keys.assignments: ">"}, count=2)
    assert await gw.assignments.finish(done)
    await gw.streams.record_leases([done, live], 600_000, new=True)
    assert await redis.zscore(keys.leases, done) is None
    assert await redis.zscore(keys.leases, live) is not None


class _Slow(Recorder):
    async def handle(self, message: Message) -> None:
        await anyio.sleep(0.25)  # slow on purpose: the stream is still owned when b starts
        await super().handle(message)


async def test_a_live_session_lock_is_alive_for_another_service(
    redis: AsyncRedis, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    stream = f"d:{uid}"
    other = f"{service}-b"
    a = consumer_factory(_Slow, config=SESSION, recovery=RecoveryConfig(lease_check_interval_s=0.2))
    b = consumer_factory(
        Recorder,
        service=other,
        config=SESSION,
        recovery=RecoveryConfig(lease_check_interval_s=0.2),
    )
    pa, pb = Producer(redis, service=service), Producer(redis, service=other)
    await pa.add_stream(stream)
    for i in range(10):
        await pa.append(stream, {"n": str(i)})
    await pa.close_stream(stream)
    async with a:
        await eventually(lambda: true(len(a.handled) >= 1), timeout_s=10)
        # Seen from the other service, the lock of a's live session is alive.
        assert await Gateway(redis, Keys(other)).liveness.lock_alive(stream)
        await pb.add_stream(stream)
        async with b:
            await eventually(lambda: true(a.ended == [stream]), timeout_s=20)
    assert a.lost == [], "another service took a live session's lock"
    assert [n for _, _, _, n in a.handled] == [str(i) for i in range(10)]
