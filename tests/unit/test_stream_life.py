"""The life of an owned stream, driven through ``Runtime`` over the in-memory gateway.

No Redis and no fixed sleeps: every wait polls a condition with a deadline. The
fake's clock is manual, so a lock expires only when a test expires it.
"""

from __future__ import annotations

import dataclasses
import time

import anyio
import pytest

from streamjobs import DeadLetter, DeadLetterReason, Message, Retry
from streamjobs._deadletter import parse_dead_letter
from streamjobs._wire import FIRST_ID_FIELD, RETRY_FIELD
from streamjobs.metrics import StreamEvent
from tests.fakes.gateway import FakeGateway, ManualClock
from tests.fakes.runtime import (
    FAST,
    FAST_LOCK,
    TEST_TIMEOUT_S,
    RecordingHooks,
    RecordingMetrics,
    assert_nothing_held,
    eventually,
    make_runtime,
    running,
)

pytestmark = pytest.mark.anyio


async def test_stream_is_handled_in_order_and_finished_by_its_end_marker(
    fake: FakeGateway,
) -> None:
    assignment = fake.add_assignment("s1", {"job": 7})
    early = fake.append_many("s1", 3)
    hooks = RecordingHooks()
    metrics = RecordingMetrics()
    runtime = make_runtime(fake, hooks, metrics=metrics)
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with running(runtime):
            await eventually(lambda: len(hooks.handled) == 3, "the first entries")
            assert runtime.owned_streams() == {"s1"}
            assert fake.lock_token("s1") == runtime.owned["s1"].token
            assert list(fake.leases) == [assignment]
            assert fake.lbs_pending == {assignment: "c1"}
            # Entries appended while the stream is idle wake it up.
            late = fake.append_many("s1", 2, start=3)
            eos = fake.close("s1")
            after_eos = fake.append("s1", {"n": "never"})
            await eventually(lambda: hooks.ended == ["s1"], "on_stream_end")
    assert hooks.started == [("s1", {"job": 7})]
    assert hooks.handled_ids() == early + late, "not every entry, or not in order"
    assert [m.fields["n"] for m in hooks.handled] == ["0", "1", "2", "3", "4"]
    assert all(m.attempt == 1 and m.info == {"job": 7} for m in hooks.handled)
    assert hooks.lost == []
    # Finished: assignment acked and deleted, lease gone, lock released, entries acked.
    assert_nothing_held(fake)
    assert fake.lbs_entries == []
    acked = fake.data_acked("s1")
    handled = [*early, *late, eos]
    assert acked[: len(handled)] == handled
    # Read with the marker (or not), never handled: the seal acks what is pending.
    assert acked[len(handled) :] in ([], [after_eos])
    assert not fake.data_pending("s1")
    assert fake.data_ttl_ms("s1") == 3_600_000  # finished_stream_ttl_s default
    # The assignment is completed before the lock is released, never the other way.
    order = [c.method for c in fake.calls if c.method in ("finish", "release")]
    assert order == ["finish", "release"]
    assert metrics.events == [StreamEvent.ACQUIRED, StreamEvent.FINISHED]


async def test_finished_stream_retention_zero_deletes_the_stream(fake: FakeGateway) -> None:
    fake.add_assignment("s1")
    fake.append_many("s1", 2)
    fake.close("s1")
    hooks = RecordingHooks()
    config = dataclasses.replace(FAST, finished_stream_ttl_s=0)
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with running(make_runtime(fake, hooks, config=config)):
            await eventually(lambda: hooks.ended == ["s1"], "on_stream_end")
    assert not fake.data_exists("s1")
    assert_nothing_held(fake)


async def test_failing_handler_is_retried_with_increasing_attempt_numbers(
    fake: FakeGateway,
) -> None:
    fake.add_assignment("s1")
    ids = fake.append_many("s1", 3)
    fake.close("s1")
    failures = {ids[1]: 1}

    async def fail_once(message: Message) -> None:
        if failures.get(message.id, 0) > 0:
            failures[message.id] -= 1
            raise RuntimeError("transient")

    hooks = RecordingHooks(fail_once)
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with running(make_runtime(fake, hooks)):
            await eventually(lambda: hooks.ended == ["s1"], "on_stream_end")
    assert hooks.attempts() == [(ids[0], 1), (ids[1], 1), (ids[1], 2), (ids[2], 1)]
    assert hooks.handled_ids() == ids
    assert fake.dead_letters == []
    assert_nothing_held(fake)


async def test_entry_that_always_fails_is_dead_lettered_and_the_next_one_follows(
    fake: FakeGateway,
) -> None:
    assignment = fake.add_assignment("s1", {"k": "v"}, **{RETRY_FIELD: "2"})
    ids = fake.append_many("s1", 3)
    eos = fake.close("s1")

    async def poison(message: Message) -> None:
        if message.id == ids[1]:
            raise ValueError(f"boom {message.attempt}")

    hooks = RecordingHooks(poison)
    config = dataclasses.replace(FAST, max_handler_attempts=3)
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with running(make_runtime(fake, hooks, config=config)):
            await eventually(lambda: hooks.ended == ["s1"], "on_stream_end")
    assert hooks.attempts() == [(ids[0], 1), (ids[1], 1), (ids[1], 2), (ids[1], 3), (ids[2], 1)]
    assert hooks.handled_ids() == [ids[0], ids[2]]
    [(dl_id, fields)] = fake.dead_letters
    record = parse_dead_letter(dl_id, fields)
    assert record.reason is DeadLetterReason.HANDLER_FAILED
    assert record.attempts == 3
    assert record.error == "ValueError: boom 3"
    assert (record.source_stream, record.source_id) == ("s1", ids[1])
    assert record.owner == "c1"
    assert record.retry_count == 2  # the assignment's count
    assert dict(record.fields) == {"n": "1"}
    assert record.dead_at_ms is not None
    # The dead-lettered entry is acked like the others; the assignment is complete.
    assert fake.data_acked("s1") == [*ids, eos]
    assert assignment not in dict(fake.lbs_entries)
    assert_nothing_held(fake)


async def test_retry_directive_waits_its_delay_and_counts_as_an_attempt(
    fake: FakeGateway,
) -> None:
    fake.add_assignment("s1")
    [entry] = fake.append_many("s1", 1)
    fake.close("s1")
    called_at: list[float] = []

    async def retry_once(message: Message) -> None:
        called_at.append(time.monotonic())
        if message.attempt == 1:
            raise Retry(delay_s=0.05)

    hooks = RecordingHooks(retry_once)
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with running(make_runtime(fake, hooks)):
            await eventually(lambda: hooks.ended == ["s1"], "on_stream_end")
    assert hooks.attempts() == [(entry, 1), (entry, 2)]
    assert called_at[1] - called_at[0] >= 0.05
    assert fake.dead_letters == []


async def test_retry_directive_on_the_last_attempt_gives_up(fake: FakeGateway) -> None:
    fake.add_assignment("s1")
    [entry] = fake.append_many("s1", 1)
    fake.close("s1")

    async def always_retry(message: Message) -> None:
        raise Retry(delay_s=0)

    hooks = RecordingHooks(always_retry)
    config = dataclasses.replace(FAST, max_handler_attempts=2)
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with running(make_runtime(fake, hooks, config=config)):
            await eventually(lambda: hooks.ended == ["s1"], "on_stream_end")
    assert hooks.attempts() == [(entry, 1), (entry, 2)]
    [(dl_id, fields)] = fake.dead_letters
    record = parse_dead_letter(dl_id, fields)
    assert (record.attempts, record.error) == (2, "Retry: retry in 0s")


async def test_dead_letter_directive_gives_up_at_once(fake: FakeGateway) -> None:
    fake.add_assignment("s1")
    ids = fake.append_many("s1", 2)
    fake.close("s1")

    async def reject_first(message: Message) -> None:
        if message.id == ids[0]:
            raise DeadLetter("bad input")

    hooks = RecordingHooks(reject_first)
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with running(make_runtime(fake, hooks)):
            await eventually(lambda: hooks.ended == ["s1"], "on_stream_end")
    assert hooks.attempts() == [(ids[0], 1), (ids[1], 1)]
    [(dl_id, fields)] = fake.dead_letters
    record = parse_dead_letter(dl_id, fields)
    assert record.reason is DeadLetterReason.REJECTED
    assert record.rejected == "bad input"
    assert (record.source_id, record.attempts) == (ids[0], 1)
    assert record.error == "DeadLetter: bad input"


async def test_lock_expiring_under_the_consumer_stops_it_and_acks_nothing_more(
    fake: FakeGateway,
) -> None:
    assignment = fake.add_assignment("s1")
    ids = fake.append_many("s1", 3)
    eos = fake.close("s1")
    in_second = anyio.Event()
    finish_second = anyio.Event()

    async def block_on_second(message: Message) -> None:
        if message.id == ids[1]:
            in_second.set()
            await finish_second.wait()

    hooks = RecordingHooks(block_on_second)
    metrics = RecordingMetrics()
    # LOCK: the heartbeat extends the lock itself, and so finds it gone.
    runtime = make_runtime(fake, hooks, metrics=metrics, config=FAST_LOCK)
    runtime.entry_size_hint = 1  # small entries seen before: read all three at once
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with running(runtime):
            await in_second.wait()
            token = runtime.owned["s1"].token
            fake.expire_lock("s1")
            # The next heartbeat finds the lock gone; the loss is reported at once,
            # while the handler call is still running.
            await eventually(lambda: hooks.lost == ["s1"], "on_stream_lost")
            assert runtime.owned_streams() == frozenset()
            reads_at_loss = len(fake.calls_of("fenced_read"))
            finish_second.set()
            await eventually(lambda: "s1" not in runtime.owned, "the stream task to end")
            await eventually(lambda: len(hooks.handled) == 2, "the running call to return")
    assert hooks.handled_ids() == ids[:2], "an entry was handed on after the loss"
    assert hooks.ended == []
    assert metrics.events == [StreamEvent.ACQUIRED, StreamEvent.LOST]
    # Nothing was acknowledged: not the entry handled before the loss (its ack was
    # still batched), not the one running when it happened.
    assert fake.data_acked("s1") == []
    assert list(fake.data_pending("s1")) == [*ids, eos]
    assert len(fake.calls_of("fenced_read")) == reads_at_loss
    assert [c for c in fake.calls_of("release") if c[1] == token] == []
    # The assignment stays pending with the dead owner, for recovery to re-queue.
    assert fake.lbs_pending == {assignment: "c1"}
    assert fake.locks == {}


async def test_lock_taken_over_by_another_consumer_stops_it_and_leaves_the_new_lock_alone(
    fake: FakeGateway,
) -> None:
    fake.add_assignment("s1")
    [first] = fake.append_many("s1", 1)
    hooks = RecordingHooks()
    runtime = make_runtime(fake, hooks)
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with running(runtime):
            await eventually(lambda: len(hooks.handled) == 1, "the first entry")
            fake.set_lock("s1", "someone-else")
            fake.append_many("s1", 1, start=1)  # wakes the idle wait: fenced read refused
            await eventually(lambda: hooks.lost == ["s1"], "on_stream_lost")
            await eventually(lambda: "s1" not in runtime.owned, "the stream task to end")
    assert hooks.handled_ids() == [first]
    assert fake.lock_token("s1") == "someone-else", "the loser touched the new owner's lock"


async def test_lock_held_elsewhere_at_acquire_hands_the_assignment_back_counted(
    fake: FakeGateway,
) -> None:
    assignment = fake.add_assignment("s1", {"a": 1}, **{RETRY_FIELD: "1"})
    ids = fake.append_many("s1", 2)
    fake.close("s1")
    fake.set_lock("s1", "previous-owner")
    hooks = RecordingHooks()
    metrics = RecordingMetrics()
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with running(make_runtime(fake, hooks, metrics=metrics)):
            # After one heartbeat interval of retries it re-queues the assignment, with a
            # retry counted: an assignment that never gets its lock must not cycle forever.
            await eventually(lambda: len(fake.lbs_history) >= 2, "a re-queue")
            assert fake.calls_of("requeue")[0] == (assignment, 2)
            assert StreamEvent.CONTENDED in metrics.events
            assert hooks.started == []
            assert hooks.calls == []
            assert fake.lock_token("s1") == "previous-owner"
            # The previous owner lets go: the re-queued assignment is taken and finished.
            fake.expire_lock("s1")
            await eventually(lambda: hooks.ended == ["s1"], "on_stream_end")
    assert hooks.handled_ids() == ids
    assert hooks.started == [("s1", {"a": 1})]
    assert StreamEvent.HANDED_BACK not in metrics.events
    assert_nothing_held(fake)
    assert fake.lbs_entries == []


async def test_an_assignment_that_never_gets_its_lock_ends_in_the_dead_letters(
    fake: FakeGateway,
) -> None:
    assignment = fake.add_assignment("s1", {"a": 1})
    fake.set_lock("s1", "a-live-owner-of-a-duplicate")
    hooks = RecordingHooks()
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with running(make_runtime(fake, hooks)):
            await eventually(lambda: len(fake.dead_letters) == 1, "a dead letter")
    [(dlq_id, fields)] = fake.dead_letters
    record = parse_dead_letter(dlq_id, fields)
    assert record.reason is DeadLetterReason.MAX_RETRIES_EXCEEDED
    assert record.retry_count == 4  # max_retries (3) re-queues, then the fourth round
    assert "lock" in record.error
    assert [c[1] for c in fake.calls_of("requeue")] == [1, 2, 3]
    assert record.source_id != assignment  # it went through re-queues
    assert hooks.calls == []
    assert fake.lock_token("s1") == "a-live-owner-of-a-duplicate"
    assert fake.lbs_entries == []
    assert fake.lbs_pending == {}


async def test_graceful_close_hands_unfinished_streams_back(fake: FakeGateway) -> None:
    fake.add_assignment("s1", {"i": 1})
    fake.add_assignment("s2", {"i": 2}, **{RETRY_FIELD: "2"})
    s1 = fake.append_many("s1", 2)
    s2 = fake.append_many("s2", 3)
    hooks = RecordingHooks()
    metrics = RecordingMetrics()
    runtime = make_runtime(fake, hooks, metrics=metrics)
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with running(runtime) as run:
            await eventually(lambda: len(hooks.handled) == 5, "every entry")
            await runtime.aclose()
            await run.wait_done()
    assert hooks.ended == []
    assert hooks.lost == []
    assert_nothing_held(fake)
    # Re-queued for another consumer, with the same retry count, not yet delivered.
    requeued = {
        str(f["stream"]): {k: v for k, v in f.items() if k != FIRST_ID_FIELD}
        for _, f in fake.lbs_entries
    }
    assert requeued == {
        "s1": {"stream": "s1", "info": '{"i":1}'},
        "s2": {"stream": "s2", "info": '{"i":2}', RETRY_FIELD: "2"},
    }
    assert sorted(fake.lbs_undelivered) == sorted(i for i, _ in fake.lbs_entries)
    # Handled entries were acked on the way out; the streams keep no retention TTL.
    assert fake.data_acked("s1") == s1
    assert fake.data_acked("s2") == s2
    assert fake.data_ttl_ms("s1") is None
    assert metrics.events.count(StreamEvent.HANDED_BACK) == 2


async def test_handler_outliving_the_grace_period_is_cancelled_and_its_entry_kept(
    fake: FakeGateway,
) -> None:
    fake.add_assignment("s1")
    ids = fake.append_many("s1", 2)
    in_second = anyio.Event()

    async def hang_on_second(message: Message) -> None:
        if message.id == ids[1]:
            in_second.set()
            await anyio.sleep_forever()

    hooks = RecordingHooks(hang_on_second)
    runtime = make_runtime(fake, hooks)
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with running(runtime):
            await in_second.wait()
            started = time.monotonic()
            await runtime.aclose()
            assert time.monotonic() - started >= FAST.shutdown_grace_s
    assert hooks.handled_ids() == ids[:1]
    assert fake.data_acked("s1") == ids[:1]
    assert list(fake.data_pending("s1")) == ids[1:]
    assert_nothing_held(fake)
    assert [f.get(RETRY_FIELD) for _, f in fake.lbs_entries] == [None]


async def test_handler_finishing_within_the_grace_period_is_acked(fake: FakeGateway) -> None:
    fake.add_assignment("s1")
    ids = fake.append_many("s1", 3)
    in_second = anyio.Event()
    proceed = anyio.Event()

    async def slow_second(message: Message) -> None:
        if message.id == ids[1]:
            in_second.set()
            await proceed.wait()

    hooks = RecordingHooks(slow_second)
    runtime = make_runtime(fake, hooks)
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with running(runtime):
            await in_second.wait()
            async with anyio.create_task_group() as tg:
                tg.start_soon(runtime.aclose)
                await eventually(lambda: runtime.draining, "shutdown to begin")
                proceed.set()
    # The running call completed and is acked; no new entry was handed on.
    assert hooks.handled_ids() == ids[:2]
    assert fake.data_acked("s1") == ids[:2]
    assert list(fake.data_pending("s1")) == ids[2:]
    assert_nothing_held(fake)


async def test_unparseable_assignment_is_dead_lettered_and_intake_goes_on(
    fake: FakeGateway,
) -> None:
    bad = fake.add_raw_assignment({"info": "{}", "note": "no stream field"})
    worse = fake.add_raw_assignment({"stream": b"\xff\xfe"})
    fake.add_assignment("s1")
    ids = fake.append_many("s1", 2)
    fake.close("s1")
    hooks = RecordingHooks()
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with running(make_runtime(fake, hooks)):
            await eventually(lambda: hooks.ended == ["s1"], "on_stream_end")
    assert hooks.handled_ids() == ids
    records = [parse_dead_letter(i, f) for i, f in fake.dead_letters]
    assert [(r.reason, r.source_id) for r in records] == [
        (DeadLetterReason.UNPARSEABLE, bad),
        (DeadLetterReason.UNPARSEABLE, worse),
    ]
    assert records[0].is_assignment
    assert records[0].source_stream == fake.keys.assignments
    assert records[0].owner == "c1"
    assert "missing field 'stream'" in records[0].error
    assert dict(records[0].fields) == {"info": "{}", "note": "no stream field"}
    assert "UTF-8" in records[1].error
    assert_nothing_held(fake)
    assert fake.lbs_entries == []


async def test_max_concurrent_streams_bounds_what_is_owned_at_once(fake: FakeGateway) -> None:
    streams = [f"s{i}" for i in range(5)]
    for s in streams:
        fake.add_assignment(s)
        fake.append_many(s, 1)
        fake.close(s)
    go = anyio.Event()

    async def wait_for_go(message: Message) -> None:
        await go.wait()

    hooks = RecordingHooks(wait_for_go)
    config = dataclasses.replace(FAST, max_concurrent_streams=2)
    runtime = make_runtime(fake, hooks, config=config)
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with running(runtime):
            await eventually(lambda: len(hooks.in_flight) == 2, "two streams handling")
            # Several intake cycles (read_block_ms = 20) later, still two: intake reads
            # only free slots, so the others are not even delivered to this consumer.
            reads = len(fake.calls_of("read_assignments"))
            await anyio.sleep(0.1)
            assert len(fake.calls_of("read_assignments")) == reads
            assert len(runtime.owned) == 2
            assert len(fake.lbs_pending) == 2
            assert len(fake.lbs_undelivered) == 3
            go.set()
            await eventually(lambda: sorted(hooks.ended) == streams, "every stream to end")
    assert hooks.peak_in_flight == 2
    assert_nothing_held(fake)


async def test_transient_redis_failures_are_retried_without_losing_or_repeating_entries(
    fake: FakeGateway,
) -> None:
    fake.add_assignment("s1")
    ids = fake.append_many("s1", 3)
    eos = fake.close("s1")
    fake.fail("read_assignments", times=2)
    # The lock was taken and the first entries read, the reply lost: they stay
    # pending with us, and the retry's read claims them.
    fake.fail("acquire_and_read", times=1, after=True)
    fake.fail("fenced_read", times=2)
    fake.fail("finish", times=1, after=True)  # completed, the reply lost
    hooks = RecordingHooks()
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with running(make_runtime(fake, hooks)):
            await eventually(lambda: hooks.ended == ["s1"], "on_stream_end")
    assert hooks.handled_ids() == ids
    assert hooks.lost == []
    assert fake.data_acked("s1") == [*ids, eos]
    assert_nothing_held(fake)
    assert fake.lbs_entries == []


async def test_lost_reply_of_the_final_release_still_reports_the_stream_ended(
    fake: FakeGateway,
) -> None:
    fake.add_assignment("s1")
    fake.append_many("s1", 2)
    fake.close("s1")
    fake.fail("release", times=1, after=True)
    hooks = RecordingHooks()
    runtime = make_runtime(fake, hooks)
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with running(runtime):
            await eventually(lambda: "s1" not in runtime.owned, "the stream task to end")
            await eventually(lambda: bool(hooks.ended or hooks.lost), "a final hook")
    assert_nothing_held(fake)  # the work itself did finish
    assert (hooks.ended, hooks.lost) == (["s1"], [])


async def test_shutdown_while_finish_fails_leaves_the_stream_finishable(
    fake: FakeGateway,
) -> None:
    fake.add_assignment("s1")
    ids = fake.append_many("s1", 2)
    eos = fake.close("s1")
    fake.fail("finish", times=1_000_000)
    hooks = RecordingHooks()
    runtime = make_runtime(fake, hooks)
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with running(runtime):
            await eventually(lambda: len(fake.calls_of("finish")) >= 1, "a finish attempt")
            await runtime.aclose()
    fake.fail("finish", times=0)
    assert_nothing_held(fake)
    assert [str(f["stream"]) for _, f in fake.lbs_entries] == ["s1"]  # handed back
    # The end was sealed (final acks and retention) before finishing failed.
    assert fake.data_acked("s1") == [*ids, eos]
    assert fake.data_ttl_ms("s1") is not None
    nxt = RecordingHooks()
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with running(make_runtime(fake, nxt, name="c2")):
            # The next owner finds the end handled and only completes the assignment:
            # no entry and no hook runs again.
            await eventually(lambda: fake.lbs_entries == [], "c2 to complete s1")
            await eventually(lambda: not fake.locks, "c2 to let go of the lock")
    assert (nxt.calls, nxt.started, nxt.ended) == ([], [], [])
    assert fake.data_ttl_ms("s1") is not None, "the retention was not restored"


async def test_a_job_queued_in_the_millisecond_its_predecessor_ended_is_not_taken_as_finished(
    fake: FakeGateway,
) -> None:
    """The previous job's end marker (data stream) and the next job's assignment
    (assignment stream) were written in the same millisecond, so both ids are ``T-0``.
    The new owner, finding nothing to read yet, must not take that marker for its own
    job's end and complete the job before its entries come."""
    clock = fake.clock
    assert isinstance(clock, ManualClock)
    hooks = RecordingHooks()
    runtime = make_runtime(fake, hooks)
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with running(runtime):
            fake.submit("s1", {"job": 1})
            clock.advance(1)
            eos = fake.close("s1")
            await eventually(lambda: hooks.ended == ["s1"], "job 1 to end")
            await eventually(lambda: not fake.locks, "job 1's lock to go")
            job2, created = fake.submit("s1", {"job": 2})
            assert created
            assert job2 == eos, "same id, different streams"
            await eventually(lambda: len(hooks.started) == 2, "job 2 to start")
            entry = fake.append("s1", {"n": "0"})
            fake.close("s1")
            await eventually(lambda: hooks.ended == ["s1", "s1"], "job 2 to end")
    assert [m.id for m in hooks.handled] == [entry]
    assert_nothing_held(fake)


@pytest.mark.parametrize("moved_ms", [1, 0], ids=["later", "same-millisecond"])
async def test_a_cancel_wakes_an_idle_job_of_a_reused_name(
    fake: FakeGateway, moved_ms: int
) -> None:
    """The stream's newest entry is the previous job's end marker: the cancel must still
    append the end marker that wakes the new job's idle owner (found by the long model
    run; tests/integration/test_cancel_stream.py has it against real Redis). With the
    clock still, that marker and the new job's assignment have the same id, as on a
    server where one job ends and the next is queued within a millisecond: the cancel
    took the marker for the job's own end and was lost."""
    hooks = RecordingHooks()
    runtime = make_runtime(fake, hooks)
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with running(runtime):
            fake.submit("s1", {"job": 1})  # assignment T-0
            fake.append("s1", {"n": "0"})  # T-0
            fake.close("s1")  # T-1: with the clock still, job 2's assignment is T-1 too
            await eventually(lambda: not fake.lbs_entries and not fake.locks, "job 1's end")
            assert isinstance(fake.clock, ManualClock)
            fake.clock.advance(moved_ms)
            job, created = fake.submit("s1", {"job": 2})
            assert created
            eos = fake.data_entries("s1")[-1][0]
            assert (eos == job) is (moved_ms == 0)
            await eventually(lambda: len(hooks.started) == 2, "job 2 owned")
            assert fake.cancel("s1") == "signalled"
            await eventually(lambda: not runtime.owned_streams(), "job 2 ended by its cancel")
    assert hooks.ended == ["s1"]
    assert fake.cancels == {}
    assert_nothing_held(fake)
