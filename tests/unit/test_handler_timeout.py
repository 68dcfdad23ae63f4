"""``handler_timeout_s``: a handler call that hangs times out and counts as a failed
attempt, over the in-memory gateway."""

from __future__ import annotations

import dataclasses

import anyio
import pytest

from streamjobs import Message
from streamjobs._deadletter import parse_dead_letter
from tests.fakes.gateway import FakeGateway
from tests.fakes.runtime import (
    FAST,
    TEST_TIMEOUT_S,
    RecordingHooks,
    eventually,
    make_runtime,
    running,
)

pytestmark = pytest.mark.anyio


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
