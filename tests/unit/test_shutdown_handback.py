"""Shutdown hands back what intake was given: an assignment delivered by a read whose
reply arrives while the consumer stops goes back to the assignment stream, uncounted."""

from __future__ import annotations

import json

import anyio
import pytest

from streamjobs._wire import RETRY_FIELD
from tests.fakes.gateway import FakeGateway
from tests.fakes.runtime import TEST_TIMEOUT_S, RecordingHooks, eventually, make_runtime, running

pytestmark = pytest.mark.anyio


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
