"""Driving a :class:`~streamjobs._runtime.Runtime` over a :class:`FakeGateway` in tests.

* :class:`RecordingHooks`: the user's side, recording every call; ``handle()`` runs an
  optional per-test behaviour first.
* :class:`RecordingMetrics`: the stream events a runtime reported.
* :func:`make_runtime`: a ``ClusterMode.PROXY`` runtime (no subscriptions, no client)
  with small timers and recovery out of the way.
* :func:`running`: runs it in a task of its own, which a test can cancel from outside.
* :func:`eventually`: poll a condition with a deadline instead of sleeping.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any, Protocol

import anyio
import anyio.abc

from streamjobs import (
    ClusterMode,
    ConsumerConfig,
    Liveness,
    Message,
    NullRecorder,
    RecoveryConfig,
)
from streamjobs._kind_runtime import Parts
from streamjobs._runtime import Runtime
from streamjobs.metrics import StreamEvent
from tests.fakes.gateway import FakeGateway, ManualClock

FAST = ConsumerConfig(
    lock_ttl_s=1,
    read_block_ms=20,
    shutdown_grace_s=0.2,
    handler_backoff_s=0.01,
    handler_backoff_max_s=0.05,
)
"""Small timers: a heartbeat every 1/3 s, idle reads of 20 ms, 0.2 s of grace."""

FAST_LOCK = dataclasses.replace(FAST, liveness=Liveness.LOCK)
"""FAST under ``Liveness.LOCK``: for tests of what a heartbeat does to each lock."""

NO_RECOVERY = RecoveryConfig(min_idle_s=300, interval_s=300, lease_check_interval_s=300)
"""Recovery that stays out of the way for the length of a test."""

STOP_TIMEOUT_S = 10.0
"""Bound on stopping a runtime (the shielded hand-back steps are bounded by 5 s each)."""

Behaviour = Callable[[Message], Awaitable[None]]


async def eventually(check: Callable[[], bool], what: str, *, timeout_s: float = 5.0) -> None:
    """Poll ``check`` every few milliseconds; fail with ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for: {what}")
        await anyio.sleep(0.002)


class RecordingHooks:
    """Records every hook call. ``behaviour(message)`` runs inside ``handle()`` first.

    Attributes:
        calls: every ``handle()`` call, failed or not, in order.
        handled: messages whose ``handle()`` call returned.
        started: ``(stream, info)`` per ``on_stream_start``.
        ended, lost: streams per ``on_stream_end`` / ``on_stream_lost``.
        in_flight: streams whose ``handle()`` call is running now; ``peak_in_flight``
            is the most there ever were at once.
    """

    def __init__(self, behaviour: Behaviour | None = None) -> None:
        self.behaviour = behaviour
        self.calls: list[Message] = []
        self.handled: list[Message] = []
        self.started: list[tuple[str, dict[str, Any]]] = []
        self.ended: list[str] = []
        self.lost: list[str] = []
        self.in_flight: set[str] = set()
        self.peak_in_flight = 0
        self.lifecycle: list[str] = []
        """``"startup"`` and ``"shutdown"``, per ``on_startup`` / ``on_shutdown`` call."""

    async def handle(self, message: Message) -> None:
        self.calls.append(message)
        self.in_flight.add(message.stream)
        self.peak_in_flight = max(self.peak_in_flight, len(self.in_flight))
        try:
            if self.behaviour is not None:
                await self.behaviour(message)
        finally:
            self.in_flight.discard(message.stream)
        self.handled.append(message)

    async def on_startup(self) -> None:
        self.lifecycle.append("startup")

    async def on_shutdown(self) -> None:
        self.lifecycle.append("shutdown")

    async def on_stream_start(self, stream: str, info: Mapping[str, Any]) -> None:
        self.started.append((stream, dict(info)))

    async def on_stream_end(self, stream: str) -> None:
        self.ended.append(stream)

    async def on_stream_lost(self, stream: str) -> None:
        self.lost.append(stream)

    def handled_ids(self, stream: str | None = None) -> list[str]:
        return [m.id for m in self.handled if stream is None or m.stream == stream]

    def attempts(self) -> list[tuple[str, int]]:
        """``(entry id, attempt)`` of every ``handle()`` call."""
        return [(m.id, m.attempt) for m in self.calls]


class RecordingMetrics(NullRecorder):
    """Records stream events; everything else is dropped."""

    def __init__(self) -> None:
        self.events: list[StreamEvent] = []

    def stream_event(self, service: str, event: StreamEvent) -> None:
        self.events.append(event)


def make_runtime(
    fake: FakeGateway,
    hooks: RecordingHooks,
    *,
    config: ConsumerConfig = FAST,
    name: str = "c1",
    recovery: RecoveryConfig = NO_RECOVERY,
    metrics: RecordingMetrics | None = None,
    cluster_mode: ClusterMode = ClusterMode.PROXY,
) -> Runtime:
    """A runtime on ``fake`` (``cluster_mode`` NONE: streams complete in one call, as
    on one server; the default, PROXY: in three, as on a cluster)."""
    parts = Parts(hooks, fake, None, name, config, recovery, metrics or RecordingMetrics())
    return Runtime(parts, cluster_mode=cluster_mode)


class Startable(Protocol):
    """A consumer kind's runtime (``Runtime`` or ``GroupRuntime``)."""

    async def run(self, task_status: anyio.abc.TaskStatus[None]) -> None: ...


class Running:
    """A runtime running in a task of its own (see :func:`running`)."""

    def __init__(self, runtime: Startable) -> None:
        self.runtime = runtime
        self.scope = anyio.CancelScope()
        self.done = anyio.Event()

    def cancel(self) -> None:
        """Cancel the task running the runtime (not a graceful ``aclose()``)."""
        self.scope.cancel()

    async def wait_done(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        with anyio.fail_after(timeout_s):
            await self.done.wait()

    async def _run(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        try:
            with self.scope:
                async with anyio.create_task_group() as tg:
                    await tg.start(self.runtime.run)
                    task_status.started()
        finally:
            self.done.set()


@asynccontextmanager
async def running(runtime: Runtime) -> AsyncIterator[Running]:
    """Run ``runtime`` until the block ends (then ``aclose()`` it, if still running).

    The runtime runs in a task of its own, under ``Running.scope``: a test may cancel
    it from outside (``Running.cancel()``) and go on awaiting things in its own task.
    """
    async with anyio.create_task_group() as tg:
        handle = Running(runtime)
        await tg.start(handle._run)
        try:
            yield handle
        finally:
            with anyio.CancelScope(shield=True), anyio.fail_after(STOP_TIMEOUT_S):
                if not handle.done.is_set():
                    await runtime.aclose()
                await handle.done.wait()


TEST_TIMEOUT_S = 15.0
"""Bound on one fake-driven test's body."""


def manual_fake() -> FakeGateway:
    """A fake on a manual clock: a lock expires only when a test expires it."""
    return FakeGateway(clock=ManualClock())


def assert_nothing_held(fake: FakeGateway) -> None:
    """No lock, no lease, and no assignment pending with anyone."""
    assert fake.locks == {}, "a lock was left behind"
    assert fake.leases == {}, "a lease was left behind"
    assert fake.lbs_pending == {}, "an assignment is still pending"
