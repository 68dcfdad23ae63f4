"""Cancelling the task that runs a consumer, at each await that matters.

A gate of the fake gateway holds one command exactly where the test wants the
cancellation to land: before the command had any effect (``after=False``: it was
never sent) or after (``after=True``: it ran, its reply never arrived). After each
cancellation the consumer must leave nothing of its own behind:

* no lock and no lease;
* the assignment finished (deleted), or re-queued, undelivered and pending with
  nobody: never pending without a lock, which recovery takes for a dead owner and
  re-queues with a counted retry;
* its ``_retry_count`` unchanged;
* entries handled before the cancellation acked, the one in flight not;
* a re-queued stream still finishable by its next owner.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import anyio
import pytest

from streamjobs import Message
from streamjobs._wire import FIRST_ID_FIELD, RETRY_FIELD
from tests.fakes.gateway import FakeGateway, Gate
from tests.fakes.runtime import (
    FAST,
    RecordingHooks,
    Running,
    eventually,
    make_runtime,
    running,
)

pytestmark = pytest.mark.anyio

TEST_TIMEOUT_S = 15.0
RETRY_COUNT = "3"
"""Every assignment here has been re-queued by recovery before: it must stay at 3."""

Outcome = Literal["finished", "requeued"]


def add_assignment(fake: FakeGateway, stream: str = "s1") -> str:
    return fake.add_assignment(stream, {"job": stream}, **{RETRY_FIELD: RETRY_COUNT})


def check_left_clean(fake: FakeGateway, assignment: str, stream: str = "s1") -> Outcome:
    """The invariants of the module docstring; returns what became of the assignment."""
    assert fake.locks == {}, "a lock was left behind"
    assert fake.leases == {}, "a lease was left behind"
    assert fake.lbs_pending == {}, "the assignment is stranded pending (recovery would count it)"
    for _, fields in fake.lbs_history:
        assert fields[RETRY_FIELD] == RETRY_COUNT, "the retry count changed"
    if not fake.lbs_entries:
        return "finished"
    [(new_id, fields)] = fake.lbs_entries
    assert new_id != assignment
    assert fields == {
        "stream": stream,
        "info": f'{{"job":"{stream}"}}',
        RETRY_FIELD: RETRY_COUNT,
        FIRST_ID_FIELD: assignment,  # a re-queued copy remembers the first submission
    }
    assert fake.lbs_undelivered == [new_id]
    return "requeued"


async def cancel_and_wait(run: Running, *gates: Gate) -> None:
    """Cancel the runtime's task; open the gates once it is stuck; wait until it ended."""
    run.cancel()
    # Let the cancellation reach every task, then open whatever still holds a command
    # (a shielded clean-up step may be waiting at a gate).
    await anyio.wait_all_tasks_blocked()
    for gate in gates:
        gate.release()
    await run.wait_done()


async def finish_elsewhere(fake: FakeGateway, stream: str = "s1") -> RecordingHooks:
    """Run a second consumer until it finished ``stream``; returns its hooks."""
    hooks = RecordingHooks()
    async with running(make_runtime(fake, hooks, name="c2")):
        await eventually(lambda: hooks.ended == [stream], f"c2 to finish {stream}")
    return hooks


@pytest.mark.parametrize("after", [False, True], ids=["unsent", "reply-lost"])
async def test_cancel_during_acquire(fake: FakeGateway, after: bool) -> None:
    assignment = add_assignment(fake)
    ids = fake.append_many("s1", 2)
    gate = fake.gate("acquire_and_read", after=after)
    hooks = RecordingHooks()
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with running(make_runtime(fake, hooks)) as run:
            await gate.entered.wait()
            token = fake.lock_token("s1")
            if after:  # taken, but the consumer does not know it
                assert token is not None
                assert token.startswith("c1:") or token.endswith("}:c1"), token
            else:
                assert token is None
            await cancel_and_wait(run, gate)
    assert check_left_clean(fake, assignment) == "requeued"
    assert hooks.calls == []
    assert hooks.started == []
    # A lost reply of the acquisition's read left its entries pending with us: the
    # next owner claims them first, in order.
    pending = fake.data_pending("s1")
    if after:
        assert pending == dict.fromkeys(ids[: len(pending)], "c1")
        assert pending
    else:
        assert pending == {}
    assert fake.data_acked("s1") == []
    fake.close("s1")
    with anyio.fail_after(TEST_TIMEOUT_S):
        nxt = await finish_elsewhere(fake)
    assert nxt.handled_ids() == ids


async def test_cancel_during_handle(fake: FakeGateway) -> None:
    assignment = add_assignment(fake)
    ids = fake.append_many("s1", 3)
    in_second = anyio.Event()

    async def block_on_second(message: Message) -> None:
        if message.id == ids[1]:
            in_second.set()
            await anyio.sleep_forever()

    hooks = RecordingHooks(block_on_second)
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with running(make_runtime(fake, hooks)) as run:
            await in_second.wait()
            await cancel_and_wait(run)
    assert check_left_clean(fake, assignment) == "requeued"
    assert hooks.handled_ids() == ids[:1]
    # The handled entry was acked on the way out; the one in flight (and the one
    # after it, read in the same batch) stay pending for the next owner.
    assert fake.data_acked("s1") == ids[:1]
    assert list(fake.data_pending("s1")) == ids[1:]
    assert hooks.ended == []
    assert hooks.lost == []
    eos = fake.close("s1")
    with anyio.fail_after(TEST_TIMEOUT_S):
        nxt = await finish_elsewhere(fake)
    assert nxt.handled_ids() == ids[1:]
    assert fake.data_acked("s1") == [*ids, eos]


@pytest.mark.parametrize(
    ("method", "after"),
    [
        pytest.param("finish", False, id="finish-unsent"),
        pytest.param("finish", True, id="finish-reply-lost"),
        pytest.param("release", False, id="release-unsent"),
        pytest.param("release", True, id="release-reply-lost"),
    ],
)
async def test_cancel_during_finish(fake: FakeGateway, method: str, after: bool) -> None:
    assignment = add_assignment(fake)
    ids = fake.append_many("s1", 2)
    eos = fake.close("s1")
    gate = fake.gate(method, after=after)
    hooks = RecordingHooks()
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with running(make_runtime(fake, hooks)) as run:
            await gate.entered.wait()
            await cancel_and_wait(run, gate)
    outcome = check_left_clean(fake, assignment)
    assert hooks.handled_ids() == ids
    for entry in ids:
        assert entry in fake.data_acked("s1"), "a handled entry was not acked"
    if outcome == "finished":
        assert fake.data_acked("s1") == [*ids, eos]
        return
    # Handed back: the end marker was read but the stream did not finish, so the
    # marker must still be there, unacked, for the next owner to finish the stream.
    assert eos in fake.data_pending("s1"), "the end marker was acked by the hand-back"
    with anyio.fail_after(TEST_TIMEOUT_S):
        nxt = await finish_elsewhere(fake)
    assert nxt.ended == ["s1"]


@pytest.mark.parametrize(
    ("method", "after"),
    [
        pytest.param("finish", True, id="finish-reply-lost"),
        pytest.param("release", False, id="release-unsent"),
        pytest.param("release", True, id="release-reply-lost"),
    ],
)
async def test_stream_finished_just_before_a_cancellation_keeps_its_retention(
    fake: FakeGateway, method: str, after: bool
) -> None:
    assignment = add_assignment(fake)
    fake.append_many("s1", 2)
    fake.close("s1")
    gate = fake.gate(method, after=after)
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with running(make_runtime(fake, RecordingHooks())) as run:
            await gate.entered.wait()
            await cancel_and_wait(run, gate)
    assert check_left_clean(fake, assignment) == "finished"
    assert fake.data_ttl_ms("s1") == 3_600_000


@pytest.mark.parametrize("method", ["requeue", "release"])
@pytest.mark.parametrize("after", [False, True], ids=["unsent", "reply-lost"])
async def test_cancel_during_hand_back(fake: FakeGateway, method: str, after: bool) -> None:
    assignment = add_assignment(fake)
    ids = fake.append_many("s1", 2)
    hooks = RecordingHooks()
    runtime = make_runtime(fake, hooks)
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with running(runtime) as run, anyio.create_task_group() as tg:
            await eventually(lambda: len(hooks.handled) == 2, "both entries")
            gate = fake.gate(method, after=after)
            tg.start_soon(runtime.aclose)
            await gate.entered.wait()
            run.cancel()
            await anyio.wait_all_tasks_blocked()
            # The hand-back is shielded: cancelling does not cut it short.
            assert not run.done.is_set()
            assert gate.waiting == 1
            gate.release()
            await run.wait_done()
    assert check_left_clean(fake, assignment) == "requeued"
    assert fake.data_acked("s1") == ids
    assert fake.data_pending("s1") == {}
    assert fake.data_ttl_ms("s1") is None  # handed back: no retention
    fake.close("s1")
    with anyio.fail_after(TEST_TIMEOUT_S):
        nxt = await finish_elsewhere(fake)
    assert nxt.calls == []  # nothing handled twice


async def test_cancel_during_handle_with_several_streams(fake: FakeGateway) -> None:
    """Every owned stream is handed back, whatever each one was doing."""
    streams = ["s1", "s2", "s3"]
    assignments = {s: add_assignment(fake, s) for s in streams}
    fake.append_many("s1", 1)  # s1: handler blocked
    fake.append_many("s2", 2)  # s2: both handled, idle
    # s3: nothing yet, idle
    blocked = anyio.Event()

    async def block_s1(message: Message) -> None:
        if message.stream == "s1":
            blocked.set()
            await anyio.sleep_forever()

    hooks = RecordingHooks(block_s1)
    config = dataclasses.replace(FAST, max_concurrent_streams=3)
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with running(make_runtime(fake, hooks, config=config)) as run:
            await blocked.wait()
            await eventually(lambda: len(hooks.handled) == 2, "s2's entries")
            await eventually(lambda: len(hooks.started) == 3, "all three streams")
            await cancel_and_wait(run)
    assert fake.locks == {}
    assert fake.leases == {}
    assert fake.lbs_pending == {}
    requeued = sorted(str(f["stream"]) for _, f in fake.lbs_entries)
    assert requeued == streams
    assert set(assignments.values()).isdisjoint(i for i, _ in fake.lbs_entries)
    assert all(f[RETRY_FIELD] == RETRY_COUNT for _, f in fake.lbs_history)
    assert fake.data_acked("s1") == []
    assert len(fake.data_pending("s1")) == 1
    assert len(fake.data_acked("s2")) == 2
