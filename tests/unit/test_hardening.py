"""Defects found by users trying bad input, odd server states and client faults.

Driven through ``Runtime`` over the in-memory gateway (no Redis); the Redis side of
each case is in tests/integration/test_hardening_redis.py.
"""

from __future__ import annotations

import dataclasses
import json

import anyio
import pytest
import redis.exceptions as rex

from streamjobs import (
    ClusterMode,
    DeadLetterReason,
    InvalidAssignment,
    InvalidStreamName,
    Message,
    NoSuchGroup,
    RedisUnavailable,
    WrongKeyType,
)
from streamjobs._deadletter import parse_dead_letter
from streamjobs._keys import Keys
from streamjobs._redis import UnexpectedClientError, translate, translated
from streamjobs._wire import RETRY_FIELD, parse_assignment
from streamjobs.exceptions import ScriptError
from streamjobs.metrics import StreamEvent
from tests.fakes.gateway import FakeGateway
from tests.fakes.runtime import (
    FAST,
    FAST_LOCK,
    TEST_TIMEOUT_S,
    RecordingHooks,
    RecordingMetrics,
    assert_nothing_held,
    eventually,
    make_runtime,
    manual_fake,
    running,
)

pytestmark = pytest.mark.anyio


@pytest.fixture
def fake() -> FakeGateway:
    return manual_fake()


# -- parsing never raises anything but InvalidAssignment ------------------------------


def test_deeply_nested_json_is_unparseable_not_a_crash() -> None:
    with pytest.raises(InvalidAssignment, match="RecursionError"):
        parse_assignment("1-0", {"stream": "s", "info": "[" * 100_000})


def test_names_under_the_key_prefix_are_reserved() -> None:
    keys = Keys("svc")
    for name in (keys.assignments, keys.dead_letters, keys.leases, keys.lock("x"), "streamjobs:"):
        with pytest.raises(InvalidStreamName, match="reserved"):
            keys.check_data_stream(name)
        with pytest.raises(InvalidAssignment, match="reserved"):
            parse_assignment("1-0", {"stream": name}, keys)
    keys.check_data_stream("streamjobs-like:but:not:ours")


async def test_the_boundary_turns_a_client_internal_error_into_a_transient_failure() -> None:
    @translated
    async def command() -> None:
        raise AttributeError("'NoneType' object has no attribute 'writelines'")

    with pytest.raises(UnexpectedClientError) as caught:
        await command()
    assert isinstance(caught.value, RedisUnavailable)
    assert isinstance(caught.value.__cause__, AttributeError)


@pytest.mark.parametrize(
    "error",
    [
        rex.MovedError("2447 127.0.0.1:17981"),  # redis-py strips the "MOVED " prefix
        rex.AskError("2447 127.0.0.1:17981"),
        rex.ResponseError("MOVED 2447 127.0.0.1:17981"),
    ],
)
@pytest.mark.parametrize("in_script", [True, False])
def test_a_slot_moved_in_a_failover_is_transient_not_a_broken_stream(
    error: Exception, in_script: bool
) -> None:
    """The cluster soak dead-lettered two assignments in a failover: a MOVED reply to
    the fenced read's own transaction came back as redis-py's MovedError, whose message
    has no "MOVED" prefix, and was taken for a script failure (PERMANENT). A dead
    assignment leaves the job's unread rest to the next job of the name."""
    out = translate(error, in_script=in_script)
    assert isinstance(out, RedisUnavailable), out
    assert not isinstance(out, ScriptError)


# -- loops survive anything ------------------------------------------------------------


async def test_unexpected_errors_in_every_loop_do_not_end_run(fake: FakeGateway) -> None:
    boom = AttributeError("'NoneType' object has no attribute 'writelines'")
    fake.fail("read_assignments", times=2, error=boom)
    fake.fail("fenced_read", times=1, error=boom)
    fake.fail("extend_many", times=2, error=boom)
    fake.fail("record_leases", times=2, error=boom)
    fake.fail("take_leases", times=1, error=boom)
    fake.add_assignment("s1")
    ids = fake.append_many("s1", 3)
    fake.close("s1")
    hooks = RecordingHooks()
    runtime = make_runtime(fake, hooks)
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with running(runtime) as run:
            await eventually(lambda: hooks.ended == ["s1"], "s1 to finish")
            assert not run.done.is_set(), "run() ended"
            assert runtime.life.active
    assert hooks.handled_ids() == ids
    assert_nothing_held(fake)


# -- one consumer, two acquisitions of one stream ---------------------------------------


async def test_a_stalled_consumer_that_retakes_its_own_stream_keeps_both_straight(
    fake: FakeGateway,
) -> None:
    first = fake.add_assignment("s1")
    ids = fake.append_many("s1", 3)
    fake.close("s1")
    release = anyio.Event()
    calls = 0

    async def stall_once(message: Message) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            await release.wait()

    hooks = RecordingHooks(stall_once)
    # A heartbeat too slow to notice the expiry by itself: the stall outlives the lock.
    config = dataclasses.replace(FAST, lock_ttl_s=100, heartbeat_interval_s=40)
    runtime = make_runtime(fake, hooks, config=config)
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with running(runtime):
            await eventually(lambda: calls == 1, "the first call to stall")
            fake.expire_lock("s1")
            assert await fake.requeue(first, 1) is not None  # what a recoverer does
            await eventually(lambda: hooks.ended == ["s1"], "the second acquisition to finish")
            release.set()
            await eventually(lambda: hooks.lost == ["s1"], "the first one to be told")
            await eventually(lambda: not runtime.owned, "both to settle")
    assert [m.id for m in hooks.handled] == [*ids, ids[0]]  # the stalled call came last
    assert_nothing_held(fake)
    assert fake.lbs_entries == []


# -- a data stream deleted, or of the wrong type ---------------------------------------


async def test_a_stream_that_vanishes_while_owned_completes_its_assignment(
    fake: FakeGateway,
) -> None:
    fake.add_assignment("s1")
    fake.append_many("s1", 2)
    hooks = RecordingHooks()
    metrics = RecordingMetrics()
    runtime = make_runtime(fake, hooks, metrics=metrics)
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with running(runtime):
            await eventually(lambda: len(hooks.handled) == 2, "the entries")
            fake.fail("fenced_read", times=1_000_000, error=NoSuchGroup("NOGROUP No such key"))
            fake.append("s1", {"n": "late"})  # wakes the idle wait
            await eventually(lambda: hooks.ended == ["s1"], "the assignment to complete")
            assert runtime.owned_streams() == frozenset()
    assert StreamEvent.VANISHED in metrics.events
    assert StreamEvent.LOST not in metrics.events
    assert_nothing_held(fake)
    assert fake.lbs_entries == []


async def test_a_data_stream_of_the_wrong_type_dead_letters_its_assignment(
    fake: FakeGateway,
) -> None:
    assignment = fake.add_assignment("s1", None, extra="kept")
    wrong_type = WrongKeyType("WRONGTYPE Operation against a key")
    fake.fail("acquire_and_read", times=1_000_000, error=wrong_type)
    hooks = RecordingHooks()
    runtime = make_runtime(fake, hooks)
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with running(runtime):
            await eventually(lambda: len(fake.dead_letters) == 1, "a dead letter")
    [(dlq_id, fields)] = fake.dead_letters
    record = parse_dead_letter(dlq_id, fields)
    assert record.reason is DeadLetterReason.UNUSABLE_STREAM
    assert record.source_id == assignment
    assert "WRONGTYPE" in record.error
    assert record.fields.get("extra") == "kept"
    assert len(fake.calls_of("acquire_and_read")) == 1, "a permanent error was retried"
    assert fake.calls_of("acquire") == []
    assert_nothing_held(fake)
    assert fake.lbs_entries == []


# -- finish(), heartbeats and finishing ------------------------------------------------


async def test_finish_ends_a_stream_that_is_waiting_for_entries(fake: FakeGateway) -> None:
    fake.add_assignment("s1")
    ids = fake.append_many("s1", 2)
    hooks = RecordingHooks()
    config = dataclasses.replace(FAST, read_block_ms=3_000)  # idle waits of 3 s
    runtime = make_runtime(fake, hooks, config=config)
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with running(runtime):
            await eventually(lambda: len(hooks.handled) == 2, "the entries")
            await eventually(lambda: bool(fake.calls_of("wait_for_entries")), "the idle wait")
            runtime.finish("s1")
            await eventually(lambda: hooks.ended == ["s1"], "finish()", timeout_s=1)
    assert fake.data_acked("s1") == ids
    assert_nothing_held(fake)


async def test_a_heartbeat_racing_a_finish_does_not_report_a_loss(fake: FakeGateway) -> None:
    fake.add_assignment("s1")
    fake.append_many("s1", 1)
    fake.close("s1")
    gate = fake.gate("extend_many")  # the heartbeat has its list, its extend waits
    may_go_on = anyio.Event()

    async def until_heartbeat(message: Message) -> None:
        await may_go_on.wait()

    hooks = RecordingHooks(until_heartbeat)
    metrics = RecordingMetrics()
    runtime = make_runtime(fake, hooks, metrics=metrics, config=FAST_LOCK)
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with running(runtime):
            await gate.entered.wait()
            may_go_on.set()
            await eventually(lambda: hooks.ended == ["s1"], "s1 to finish")
            gate.release()  # the extend now finds the lock released by the finish
            await eventually(lambda: len(fake.calls_of("record_leases")) >= 1, "the heartbeat")
    assert hooks.lost == []
    assert StreamEvent.LOST not in metrics.events


async def test_a_hung_handler_times_out_and_counts_as_a_failed_attempt(
    fake: FakeGateway,
) -> None:
    fake.add_assignment("s1")
    ids = fake.append_many("s1", 3)
    fake.close("s1")

    async def hang_on_the_second(message: Message) -> None:
        if message.id == ids[1]:
            await anyio.sleep_forever()

    hooks = RecordingHooks(hang_on_the_second)
    config = dataclasses.replace(FAST, handler_timeout_s=0.05, max_handler_attempts=2)
    runtime = make_runtime(fake, hooks, config=config)
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with running(runtime):
            await eventually(lambda: hooks.ended == ["s1"], "s1 to finish")
    assert hooks.handled_ids() == [ids[0], ids[2]]
    assert [a for e, a in hooks.attempts() if e == ids[1]] == [1, 2]
    [(dlq_id, fields)] = fake.dead_letters
    record = parse_dead_letter(dlq_id, fields)
    assert record.error.startswith("HandlerTimeout: ")
    assert record.attempts == 2


# -- shutdown and intake ---------------------------------------------------------------


async def test_shutdown_hands_back_what_an_answered_intake_read_delivered(
    fake: FakeGateway,
) -> None:
    hooks = RecordingHooks()
    runtime = make_runtime(fake, hooks)
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with running(runtime) as run:
            await eventually(lambda: bool(fake.calls_of("read_assignments")), "an intake read")
            gate = fake.gate("read_assignments", after=True)  # delivered, reply held
            assignment = fake.add_assignment("s1", {"k": 1})
            await gate.entered.wait()
            assert fake.lbs_pending == {assignment: "c1"}
            async with anyio.create_task_group() as tg:
                tg.start_soon(runtime.aclose)
                await anyio.sleep(0.05)  # let shutdown begin while the reply is held
                gate.release()
            await run.wait_done()
    assert hooks.handled == []
    assert fake.lbs_pending == {}, "a delivered assignment was left pending"
    [(_, fields)] = fake.lbs_entries
    assert json.loads(str(fields["info"])) == {"k": 1}
    assert RETRY_FIELD not in fields, "handing back counted a retry"
    assert fake.locks == {}


async def test_a_heartbeat_succeeds_in_part_when_one_node_is_away(fake: FakeGateway) -> None:
    fake.add_assignment("s1")
    fake.add_assignment("s2")
    fake.append("s1", {"n": "0"})
    fake.append("s2", {"n": "0"})
    hooks = RecordingHooks()
    metrics = RecordingMetrics()
    runtime = make_runtime(fake, hooks, metrics=metrics, config=FAST_LOCK)
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with running(runtime):
            await eventually(lambda: len(hooks.handled) == 2, "one entry of each")
            fake.unreachable.add("s1")  # the primary holding s1's lock fails over
            heartbeats = len(fake.calls_of("extend_many"))
            # Past one lock TTL (1 s), s2's lease lives on through partial heartbeats,
            # while s1's lapses: its entries wait, and it is not reported lost.
            await eventually(
                lambda: len(fake.calls_of("extend_many")) >= heartbeats + 4, "heartbeats"
            )
            fake.append("s1", {"n": "1"})
            fake.append("s2", {"n": "1"})
            await eventually(lambda: len(hooks.handled_ids("s2")) == 2, "s2 to go on")
            assert hooks.handled_ids("s1") == [hooks.handled[0].id]
            fake.unreachable.clear()  # the failover is over
            await eventually(lambda: len(hooks.handled_ids("s1")) == 2, "s1 to resume")
    assert hooks.lost == []
    assert StreamEvent.LOST not in metrics.events


async def test_an_assignment_recovered_while_its_reader_stalled_is_dropped(
    fake: FakeGateway,
) -> None:
    first = fake.add_assignment("s1")
    ids = fake.append_many("s1", 2)
    fake.close("s1")
    gate = fake.gate("take_leases")  # c1 read the assignment, then froze
    hooks = RecordingHooks()
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with running(make_runtime(fake, hooks)):
            await gate.entered.wait()
            assert await fake.requeue(first, 1) is not None  # the scan re-queued it
            gate.release()
            await eventually(lambda: hooks.ended == ["s1"], "the copy to finish")
            await eventually(lambda: fake.locks == {}, "every lock to go")
    assert hooks.handled_ids() == ids  # once: the stale assignment was not run
    assert hooks.started == [("s1", {})]
    assert_nothing_held(fake)
    assert fake.lbs_entries == []


async def test_a_stream_already_handled_to_its_end_is_only_completed(
    fake: FakeGateway,
) -> None:
    """Its owner sealed it (final acks, retention) and died before finishing."""
    first = fake.add_assignment("s1")
    ids = fake.append_many("s1", 2)
    eos = fake.close("s1")
    fake.fail("finish", times=1_000_000)
    dead = RecordingHooks()
    async with running(make_runtime(fake, dead, name="dead")) as run:
        await eventually(lambda: bool(fake.calls_of("finish")), "the owner to seal the end")
        fake.fail("requeue", times=1_000_000)  # the kill: no hand-back gets through
        run.cancel()
        await run.wait_done()
    fake.fail("finish", times=0)
    fake.fail("requeue", times=0)
    fake.expire_lock("s1")
    assert await fake.requeue(first, 1) is not None  # recovery, after the lock expired
    assert fake.data_acked("s1") == [*ids, eos]
    hooks = RecordingHooks()
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with running(make_runtime(fake, hooks, name="c2")):
            await eventually(lambda: fake.lbs_entries == [], "the assignment to complete")
            await eventually(lambda: fake.locks == {}, "the lock to go")
    assert (hooks.calls, hooks.started, hooks.ended, hooks.lost) == ([], [], [], [])
    assert fake.data_ttl_ms("s1") is not None
    assert_nothing_held(fake)


async def test_a_read_reply_acted_on_after_a_pause_starts_nothing(fake: FakeGateway) -> None:
    """The first read ran while the lock was ours; the consumer then stalled before it
    acted on the reply (a SIGSTOP between the two, as the 30-minute soak met) and
    another owner took the stream. ``on_stream_start`` must not run for a stream that
    is someone else's now, nor may any entry reach ``handle()``: the lock is read
    again first, and the stream is lost."""
    fake.add_assignment("s1")
    fake.append_many("s1", 3)
    # The first read goes with the acquisition: it ran; its reply waits.
    gate = fake.gate("acquire_and_read", after=True)
    hooks = RecordingHooks()
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with running(make_runtime(fake, hooks, config=FAST_LOCK)):
            await gate.entered.wait()
            fake.set_lock("s1", "other:0123456789abcdef")  # the new owner
            await anyio.sleep(0.1)  # the pause: longer than the 50 ms re-check bound
            gate.release()
            await eventually(lambda: hooks.lost == ["s1"], "the loss to be noticed")
    assert hooks.started == [], "on_stream_start ran for a stream it no longer owned"
    assert hooks.handled == []


async def test_a_redis_blip_at_start_up_does_not_end_run(fake: FakeGateway) -> None:
    """A worker that starts while Redis drops its connections (or restarts) tries its
    start-up again instead of exiting, as the 30-minute soak saw three workers do."""
    fake.fail("ensure_group", times=2)  # RedisUnavailable, twice
    fake.add_assignment("s1")
    ids = fake.append_many("s1", 2)
    fake.close("s1")
    hooks = RecordingHooks()
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with running(make_runtime(fake, hooks)) as run:
            await eventually(lambda: hooks.ended == ["s1"], "s1 to finish")
            assert not run.done.is_set(), "run() ended"
    assert len(fake.calls_of("ensure_group")) == 3
    assert hooks.handled_ids() == ids


async def test_redis_away_for_the_whole_start_up_window_is_raised(
    fake: FakeGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    import streamjobs._runtime

    monkeypatch.setattr(streamjobs._runtime, "START_UP_RETRY_S", 0.5)
    fake.fail("ensure_group", times=1_000)
    runtime = make_runtime(fake, RecordingHooks())
    with anyio.fail_after(TEST_TIMEOUT_S), pytest.raises(RedisUnavailable):
        await runtime.run(anyio.TASK_STATUS_IGNORED)
    assert 2 <= len(fake.calls_of("ensure_group")) < 1_000


async def test_a_failed_completion_whose_stream_was_taken_over_is_lost_not_finished(
    fake: FakeGateway,
) -> None:
    """On one server a stream completes in one call. That call failed, Redis was away
    long enough for recovery to re-queue the assignment, and a successor took the lock
    (the 30-minute soak met this across a Redis restart). The retry finds the lock
    someone else's: the stream is lost, not finished, and the successor runs it."""
    first = fake.add_assignment("s1")
    fake.append_many("s1", 2)
    fake.close("s1")
    fake.fail("complete", times=1)  # failed before it ran
    gate = fake.gate("complete")  # the retry waits until the successor has the lock
    hooks = RecordingHooks()
    runtime = make_runtime(fake, hooks, cluster_mode=ClusterMode.NONE)
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with running(runtime):
            await gate.entered.wait()
            assert await fake.requeue(first, 1) is not None  # recovery, meanwhile
            fake.set_lock("s1", "successor:0123456789abcdef")
            gate.release()
            await eventually(lambda: hooks.lost == ["s1"], "the loss")
    assert hooks.ended == []


async def test_a_completion_whose_reply_was_lost_is_finished(fake: FakeGateway) -> None:
    """The one-call completion ran, its reply was lost: the retry finds the lock gone
    and the job's end recorded, so the stream is finished, not lost."""
    fake.add_assignment("s1")
    ids = fake.append_many("s1", 2)
    fake.close("s1")
    fake.fail("complete", times=1, after=True)  # ran; the reply was lost
    hooks = RecordingHooks()
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with running(make_runtime(fake, hooks, cluster_mode=ClusterMode.NONE)):
            await eventually(lambda: hooks.ended == ["s1"], "the end")
    assert hooks.lost == []
    assert hooks.handled_ids() == ids
    assert_nothing_held(fake)
