"""How an owned stream completes, over the in-memory gateway: ``finish()`` of a stream
waiting for entries, a stream its dead owner handled to its end, and a completion whose
call failed or whose reply was lost."""

from __future__ import annotations

import dataclasses

import anyio
import pytest

from streamjobs import ClusterMode
from tests.fakes.gateway import FakeGateway
from tests.fakes.runtime import (
    FAST,
    TEST_TIMEOUT_S,
    RecordingHooks,
    assert_nothing_held,
    eventually,
    make_runtime,
    running,
)

pytestmark = pytest.mark.anyio


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
