"""An owner that stalls (a long handler call, a frozen read, a paused process) while
its stream moves on, over the in-memory gateway: it neither runs the stream twice nor
acts on a reply it got before it stalled."""

from __future__ import annotations

import dataclasses

import anyio
import pytest

from streamjobs import Message
from tests.fakes.gateway import FakeGateway
from tests.fakes.runtime import (
    FAST,
    FAST_LOCK,
    TEST_TIMEOUT_S,
    RecordingHooks,
    assert_nothing_held,
    eventually,
    make_runtime,
    running,
)

pytestmark = pytest.mark.anyio


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
