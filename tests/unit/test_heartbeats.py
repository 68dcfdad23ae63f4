"""Heartbeats over the in-memory gateway: one racing a finish reports no loss, and one
that reaches only some nodes keeps the streams of those nodes."""

from __future__ import annotations

import anyio
import pytest

from streamjobs import Message
from streamjobs.metrics import StreamEvent
from tests.fakes.gateway import FakeGateway
from tests.fakes.runtime import (
    FAST_LOCK,
    TEST_TIMEOUT_S,
    RecordingHooks,
    RecordingMetrics,
    eventually,
    make_runtime,
    running,
)

pytestmark = pytest.mark.anyio


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
