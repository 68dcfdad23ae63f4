"""``on_startup`` and ``on_shutdown`` around ``run()``, on the in-memory gateway: when
they run against what the consumer holds, and what a failure of each does (the
process-level tests are tests/faults/test_worker_lifecycle.py)."""

from __future__ import annotations

import anyio
import pytest

from streamjobs import HookFailed, RedisUnavailable
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


class Observing(RecordingHooks):
    """Records which gateway calls had happened when each hook ran; can fail either."""

    def __init__(self, fake: FakeGateway, fail: str | None = None) -> None:
        super().__init__()
        self.fake = fake
        self.fail = fail
        self.seen: dict[str, set[str]] = {}

    async def on_startup(self) -> None:
        await super().on_startup()
        self.seen["startup"] = {c.method for c in self.fake.calls}
        if self.fail == "startup":
            raise RuntimeError("no database")

    async def on_shutdown(self) -> None:
        await super().on_shutdown()
        self.seen["shutdown"] = set(self.fake.locks)
        if self.fail == "shutdown":
            raise RuntimeError("pool would not close")


async def test_startup_runs_before_any_read_and_shutdown_after_the_last_hand_back(
    fake: FakeGateway,
) -> None:
    fake.add_assignment("s1")
    fake.append_many("s1", 2)
    hooks = Observing(fake)
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with running(make_runtime(fake, hooks)):
            await eventually(lambda: len(hooks.handled) == 2, "both entries")
            assert fake.locks, "the stream is held while running"
    assert hooks.lifecycle == ["startup", "shutdown"]
    assert hooks.seen["startup"].isdisjoint({"read_assignments", "acquire_and_read", "acquire"})
    assert hooks.seen["shutdown"] == set(), "on_shutdown ran while a lock was still held"
    assert_nothing_held(fake)


async def test_a_failing_startup_takes_nothing_and_still_shuts_down(fake: FakeGateway) -> None:
    fake.add_assignment("s1")
    hooks = Observing(fake, fail="startup")
    runtime = make_runtime(fake, hooks)
    with anyio.fail_after(TEST_TIMEOUT_S), pytest.raises(HookFailed) as raised:
        await runtime.run(anyio.TASK_STATUS_IGNORED)
    assert str(raised.value) == "on_startup() raised RuntimeError: no database"
    assert raised.value.hook == "on_startup"
    assert isinstance(raised.value.__cause__, RuntimeError)
    assert hooks.lifecycle == ["startup", "shutdown"]
    assert not {"read_assignments", "acquire_and_read"} & {c.method for c in fake.calls}
    assert fake.lbs_pending == {}


async def test_a_failing_shutdown_is_raised_after_a_clean_stop(fake: FakeGateway) -> None:
    hooks = Observing(fake, fail="shutdown")
    runtime = make_runtime(fake, hooks)

    async def run_and_stop() -> None:
        async with anyio.create_task_group() as tg:
            await tg.start(runtime.run)
            await runtime.aclose()

    with anyio.fail_after(TEST_TIMEOUT_S), pytest.raises(ExceptionGroup) as raised:
        await run_and_stop()
    assert raised.group_contains(HookFailed, match="^on_shutdown\\(\\) raised RuntimeError")
    assert hooks.lifecycle == ["startup", "shutdown"]


async def test_a_start_that_fails_before_the_hook_still_shuts_down(
    fake: FakeGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    import streamjobs._runtime

    monkeypatch.setattr(streamjobs._runtime, "START_UP_RETRY_S", 0.2)
    fake.fail("ensure_group", times=1_000)
    hooks = Observing(fake)
    runtime = make_runtime(fake, hooks)
    with anyio.fail_after(TEST_TIMEOUT_S), pytest.raises(RedisUnavailable):
        await runtime.run(anyio.TASK_STATUS_IGNORED)
    assert hooks.lifecycle == ["shutdown"]


async def test_a_clean_stop_is_recorded_and_a_new_start_clears_it(fake: FakeGateway) -> None:
    runtime = make_runtime(fake, RecordingHooks(), name="c1")
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with running(runtime):
            await runtime.wait_ready()
            assert "c1" not in fake.stopped
    assert "c1" in fake.stopped, "a clean stop was not recorded"
    with anyio.fail_after(TEST_TIMEOUT_S):
        async with running(runtime):
            await runtime.wait_ready()
            assert "c1" not in fake.stopped, "a running consumer still reads as stopped"


async def test_async_with_raises_the_hook_s_error_itself() -> None:
    """``async with consumer`` raises what ``run()`` raised at start, not a task
    group's wrapper around it (on the in-memory client: no server needed)."""
    from streamjobs import Message, StreamConsumer
    from streamjobs.testing import fake_redis

    calls: list[str] = []

    class NoDatabase(StreamConsumer):
        async def handle(self, message: Message) -> None: ...

        async def on_startup(self) -> None:
            raise RuntimeError("no database")

        async def on_shutdown(self) -> None:
            calls.append("shutdown")

    consumer = NoDatabase(fake_redis(), service="svc")
    with anyio.fail_after(TEST_TIMEOUT_S), pytest.raises(HookFailed, match="no database"):
        async with consumer:
            pytest.fail("the body ran although the start failed")
    assert calls == ["shutdown"]
