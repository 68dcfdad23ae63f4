"""``run()`` survives what goes wrong around it, over the in-memory gateway: unexpected
errors in any of its loops, Redis away for a moment at start-up; Redis away for the
whole start-up window is raised."""

from __future__ import annotations

import anyio
import pytest

from streamjobs import RedisUnavailable
from tests.fakes.gateway import FakeGateway
from tests.fakes.runtime import (
    TEST_TIMEOUT_S,
    RecordingHooks,
    assert_nothing_held,
    eventually,
    make_runtime,
    running,
)

pytestmark = pytest.mark.anyio


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
