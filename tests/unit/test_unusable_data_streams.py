"""A data stream deleted while owned, or a key of the wrong type where one should be,
over the in-memory gateway: the assignment completes or is dead-lettered, and nothing
is left held (the Redis side: tests/integration/test_unusable_data_streams.py)."""

from __future__ import annotations

import anyio
import pytest

from streamjobs import DeadLetterReason, NoSuchGroup, WrongKeyType
from streamjobs._deadletter import parse_dead_letter
from streamjobs.metrics import StreamEvent
from tests.fakes.gateway import FakeGateway
from tests.fakes.runtime import (
    TEST_TIMEOUT_S,
    RecordingHooks,
    RecordingMetrics,
    assert_nothing_held,
    eventually,
    make_runtime,
    running,
)

pytestmark = pytest.mark.anyio


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
