"""Where features meet (issue: correct at the seams), against real Redis."""

from __future__ import annotations

import json
import logging
from typing import Any, TypeVar

import anyio
import pytest
from redis.asyncio import Redis as AsyncRedis

from streamjobs import ClusterMode, ConsumerConfig, Liveness, Message, Producer, RecoveryConfig
from streamjobs._keys import Keys
from streamjobs._recovery import Recoverer
from streamjobs._recovery_loops import RecoveryLoops
from streamjobs._redis import Gateway
from streamjobs._redis._assignments import AssignmentCommands
from streamjobs._redis._completion import CompletionCommands
from streamjobs._session import member, session_token
from streamjobs.exceptions import RedisUnavailable
from streamjobs.metrics import NullRecorder, RequeueOutcome, StreamEvent
from tests.harness.plugin import ConsumerFactory

from ._helpers import Recorder, eventually

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


# -- a consumer run twice (items 5 and 8) ------------------------------------------------

SESSION = ConsumerConfig(
    lock_ttl_s=1.0, liveness=Liveness.SESSION, read_block_ms=100, max_concurrent_streams=20
)


async def _incarnation(redis: AsyncRedis, service: str, consumer: str) -> str:
    value = await redis.get(Keys(service).session(consumer))
    assert value is not None, f"consumer {consumer!r} has no session"
    found = json.loads(value)["incarnation"]
    assert isinstance(found, str)
    return found


async def test_a_second_run_keeps_running_until_stopped(
    redis: AsyncRedis, service: str, consumer_factory: ConsumerFactory
) -> None:
    c = consumer_factory(Recorder, config=SESSION)
    async with c:
        pass
    returned = anyio.Event()

    async def run_again() -> None:
        await c.run()
        returned.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(run_again)
        with anyio.fail_after(10):
            await c.wait_ready()
        # A run whose stop signal was left set returns within ~0.3 s by itself.
        with anyio.move_on_after(2):
            await returned.wait()
        assert not returned.is_set(), "the second run() returned without being stopped"
        assert c.statistics().running
        await c.aclose()
        with anyio.fail_after(10):
            await returned.wait()


async def test_each_run_is_a_new_session_incarnation(
    redis: AsyncRedis, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    name = f"c-{uid}"
    c = consumer_factory(Recorder, config=SESSION, consumer_name=name)
    async with c:
        first = await _incarnation(redis, service, name)
    # As if the first run had stopped hard and failed to release a lock: the lock it
    # left names its incarnation.
    stream = f"d:{uid}"
    gw = Gateway(redis, Keys(service))
    await redis.set(Keys(service).lock(stream), session_token(first, name, service), px=600_000)
    async with c:
        second = await _incarnation(redis, service, name)
        assert second != first
        assert not await gw.liveness.lock_alive(stream), "the first run's session came back"


async def test_a_lock_left_by_an_earlier_run_does_not_bounce_its_assignment(
    redis: AsyncRedis, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    """The whole case: the earlier run's lock is taken over, not seen as alive (which
    re-queued the assignment as contended until it was dead-lettered)."""
    name = f"c-{uid}"
    stream = f"d:{uid}"
    recovery = RecoveryConfig(interval_s=30, lease_check_interval_s=0.2, max_retries=1)
    c = consumer_factory(Recorder, config=SESSION, recovery=recovery, consumer_name=name)
    async with c:
        first = await _incarnation(redis, service, name)
    await redis.set(Keys(service).lock(stream), session_token(first, name, service), px=600_000)
    producer = Producer(redis, service=service)
    await producer.add_stream(stream)
    await producer.append(stream, {"n": "0"})
    await producer.close_stream(stream)
    async with c:
        await eventually(lambda: _true(c.ended == [stream]), timeout_s=15)
    assert [n for _, _, _, n in c.handled] == ["0"]
    assert await redis.xlen(Keys(service).dead_letters) == 0
    assert await redis.exists(Keys(service).lock(stream)) == 0


async def _true(value: bool) -> bool:
    return value


# -- a failed recovery call under SESSION (item 6) ---------------------------------------


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


# -- two services on one stream under SESSION (item 7) -----------------------------------


class _Slow(Recorder):
    async def handle(self, message: Message) -> None:
        await anyio.sleep(0.25)
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
        await eventually(lambda: _true(len(a.handled) >= 1), timeout_s=10)
        # Seen from the other service, the lock of a's live session is alive.
        assert await Gateway(redis, Keys(other)).liveness.lock_alive(stream)
        await pb.add_stream(stream)
        async with b:
            await eventually(lambda: _true(a.ended == [stream]), timeout_s=20)
    assert a.lost == [], "another service took a live session's lock"
    assert [n for _, _, _, n in a.handled] == [str(i) for i in range(10)]


# -- a dead session's lock once its assignment is moved (item 13) ------------------------


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


# -- a data stream deleted while owned and idle (item 9) ----------------------------------


async def test_a_stream_deleted_while_owned_and_idle_is_released_within_seconds(
    redis: AsyncRedis, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    """The shared idle wait checks that its streams still exist; without that, an idle
    stream noticed its deletion only at its safety re-read, 150 to 300 s later."""
    stream = f"d:{uid}"
    keys = Keys(service)
    producer = Producer(redis, service=service)
    await producer.add_stream(stream)
    await producer.append(stream, {"n": "0"})
    c = consumer_factory(Recorder, config=ConsumerConfig(read_block_ms=500))
    async with c:
        await eventually(lambda: _true(len(c.handled) == 1))
        await redis.delete(stream)

        async def released() -> bool:
            pending: int = (await redis.xpending(keys.assignments, service))["pending"]
            return pending == 0 and not await redis.exists(keys.lock(stream))

        # read_block_ms + the 2 s check + a fenced read, with room for a slow machine.
        await eventually(released, timeout_s=8)
        assert c.statistics().stream_events.get(StreamEvent.VANISHED.value) == 1
    assert await redis.xlen(keys.assignments) == 0
    assert await redis.hget(keys.active, stream) is None


async def test_a_stream_replaced_by_another_type_while_idle_stalls_no_other_stream(
    redis: AsyncRedis, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    """A key of another type where an idle owned stream was makes the shared wait's
    XREAD fail (WRONGTYPE) for every stream in it. Each stream then reads by itself:
    the one at fault is dead-lettered as unusable, the others keep getting entries.
    Before, all of them slept until their safety re-read, 150 to 300 s later."""
    bad, good = f"d:{uid}:bad", f"d:{uid}:good"
    keys = Keys(service)
    producer = Producer(redis, service=service)
    for stream in (bad, good):
        await producer.add_stream(stream)
        await producer.append(stream, {"n": "0"})
    c = consumer_factory(Recorder, config=ConsumerConfig(read_block_ms=500))
    async with c:
        await eventually(lambda: _true(len(c.handled) == 2))
        # DEL and SET at once: the DEL's event wakes the stream on a cluster (a SET
        # publishes in a class the waiter does not subscribe to), and no read sees
        # the key missing in between (a vanished stream is another path).
        await redis.eval(
            "redis.call('DEL', KEYS[1]) return redis.call('SET', KEYS[1], ARGV[1])",
            1,
            bad,
            "not a stream",
        )
        await producer.append(good, {"n": "1"})

        async def both_moved_on() -> bool:
            handled = [(s, n) for _, s, _, n in c.handled]
            return (good, "1") in handled and await redis.xlen(keys.dead_letters) == 1

        await eventually(both_moved_on, timeout_s=10)
        [(_, letter)] = list(await redis.xrange(keys.dead_letters) or [])
        assert letter[b"_dlq_reason"] == b"unusable_stream"
        assert letter[b"stream"] == bad.encode()
        await producer.append(good, {"n": "2"})
        await eventually(lambda: _true(len(c.handled) == 4), timeout_s=5)
    assert not await redis.exists(keys.lock(bad))


# -- finish() and the next job of the same name (item 2) ---------------------------------


class _FinishesEarly(Recorder):
    async def handle(self, message: Message) -> None:
        await super().handle(message)
        if message.fields.get("n") == "2":
            self.finish(message.stream)


async def test_finish_leaves_nothing_for_the_next_job_of_the_same_name(
    redis: AsyncRedis, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    stream = f"d:{uid}"
    keys = Keys(service)
    producer = Producer(redis, service=service)
    await producer.add_stream(stream)
    for i in range(10):
        await producer.append(stream, {"n": str(i)})
    await producer.close_stream(stream)
    c = consumer_factory(_FinishesEarly, config=ConsumerConfig(read_block_ms=200))
    async with c:
        await eventually(lambda: _true(c.ended == [stream]))
        assert [n for _, _, _, n in c.handled] == ["0", "1", "2"]
        await producer.add_stream(stream)
        await producer.append(stream, {"n": "job2"})
        await producer.close_stream(stream)
        await eventually(lambda: _true(c.ended == [stream, stream]))
    assert [n for _, _, _, n in c.handled] == ["0", "1", "2", "job2"]
    assert (await redis.xpending(stream, service))["pending"] == 0
    assert await redis.exists(keys.lock(stream)) == 0


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


# -- a lease recorded late (found by the soak) -------------------------------------------


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


# -- an owner that dies between completing its assignment and releasing its lock -----------


def _three_steps(redis: Any) -> ClusterMode:
    """The cluster mode in which a stream is completed in three calls (seal, finish,
    release): a cluster's own, else PROXY (every mode but NONE)."""
    return ClusterMode.OSS if hasattr(redis, "get_node_from_key") else ClusterMode.PROXY


_REPLACE = "redis.call('DEL', KEYS[1]); return redis.call('SET', KEYS[1], ARGV[1])"


class _CannotRelease(CompletionCommands):
    """Real Redis, but every ``release`` fails: as an owner killed after its assignment
    went and before its lock did."""

    async def release(self, *args: Any, **kwargs: Any) -> bool:
        raise RedisUnavailable("injected: release failed")


def _gateway_that_cannot_release(*args: Any, **kwargs: Any) -> Gateway:
    gateway = Gateway(*args, **kwargs)
    gateway.completion = _CannotRelease(gateway)
    return gateway


@pytest.mark.parametrize("path", ["finished", "dead_lettered"])
async def test_a_lock_left_after_its_assignment_went_lives_only_the_short_ttl(
    redis: AsyncRedis, service: str, uid: str, consumer_factory: ConsumerFactory,
    monkeypatch: pytest.MonkeyPatch, path: str,
) -> None:  # fmt: skip
    """Under SESSION a lock lives 10 minutes. An owner that completes (or dead-letters)
    its assignment and never gets to release the lock must not leave one that long:
    nothing points at it any more, so no recovery would remove it. Before the
    assignment goes, the lock is cut to ``lock_ttl_s`` (docs/design.md#sessions)."""
    import streamjobs.consumer

    monkeypatch.setattr(streamjobs.consumer, "Gateway", _gateway_that_cannot_release)
    keys = Keys(service)
    stream = f"d:{uid}"
    producer = Producer(redis, service=service)
    await producer.add_stream(stream)
    await producer.append(stream, {"n": "0"})
    if path == "finished":
        await producer.close_stream(stream)
    # On one server (ClusterMode.NONE) a finish is one script with no window between
    # its steps; PROXY mode takes the three steps a cluster takes.
    mode = {} if path == "dead_lettered" else {"cluster_mode": _three_steps(redis)}
    c = consumer_factory(Recorder, config=SESSION, recovery=RecoveryConfig(interval_s=30), **mode)
    assert SESSION.session_lock_ttl_ms >= 600_000

    async def assignment_gone_lock_left() -> bool:
        return await redis.xlen(keys.assignments) == 0 and bool(
            await redis.exists(keys.lock(stream))
        )

    async with c:
        if path == "dead_lettered":
            await eventually(lambda: _true(len(c.handled) == 1))
            # Unusable while owned: its next read fails for good, the assignment goes
            # to the dead-letter stream.
            # Replaced at once (one script), so that its owner's next read meets the
            # string, whichever wait woke it.
            await redis.eval(_REPLACE, 1, stream, "not a stream")
        await eventually(assignment_gone_lock_left)
        ttl = await redis.pttl(keys.lock(stream))
        assert 0 < ttl <= 1000, f"the lock keeps {ttl} ms (lock_ttl_s is 1 s)"
        assert await redis.xlen(keys.dead_letters) == (path == "dead_lettered")
        assert [n for _, _, _, n in c.handled] == ["0"]

    async def lock_gone() -> bool:
        return not await redis.exists(keys.lock(stream))

    await eventually(lock_gone, timeout_s=5)


_T = TypeVar("_T")


class _LastReplyLost(CompletionCommands):
    """Real Redis, but the reply to the call that releases a finished stream's lock
    (``complete`` on one server, ``release`` after seal and finish on a cluster) is
    lost once: the call was carried out, the caller sees a dropped connection."""

    lost = 0

    async def complete(self, *args: Any, **kwargs: Any) -> tuple[bool, bool]:
        done = await super().complete(*args, **kwargs)
        return self._lose(done)

    async def release(self, *args: Any, **kwargs: Any) -> bool:
        done = await super().release(*args, **kwargs)
        return self._lose(done)

    def _lose(self, done: _T) -> _T:
        if not type(self).lost:
            type(self).lost += 1
            raise RedisUnavailable("injected: connection lost after the call")
        return done


def _gateway_losing_a_last_reply(*args: Any, **kwargs: Any) -> Gateway:
    gateway = Gateway(*args, **kwargs)
    gateway.completion = _LastReplyLost(gateway)
    return gateway


async def test_a_lost_reply_to_the_final_release_still_finishes_the_stream(
    redis: AsyncRedis, service: str, uid: str, consumer_factory: ConsumerFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """The retry finds the lock gone because the lost call released it: the stream is
    finished (``on_stream_end``), not lost, and nothing is left behind."""
    import streamjobs.consumer

    monkeypatch.setattr(_LastReplyLost, "lost", 0)
    monkeypatch.setattr(streamjobs.consumer, "Gateway", _gateway_losing_a_last_reply)
    keys = Keys(service)
    stream = f"d:{uid}"
    producer = Producer(redis, service=service)
    await producer.add_stream(stream)
    await producer.append(stream, {"n": "0"})
    await producer.close_stream(stream)
    c = consumer_factory(Recorder, config=SESSION)
    async with c:
        await eventually(lambda: _true(c.ended == [stream]))
    assert _LastReplyLost.lost == 1, "the fault was not met"
    assert c.lost == []
    assert [n for _, _, _, n in c.handled] == ["0"]
    assert await redis.xlen(keys.assignments) == 0
    assert not await redis.exists(keys.lock(stream))
    assert await redis.zcard(keys.leases) == 0
    assert c.statistics().stream_events.get(StreamEvent.FINISHED.value) == 1
