"""A stateful model test of where features meet (issue 21), over the in-memory gateway.

Hypothesis drives two consumers (real ``Runtime`` objects, each ``run()`` again after
a stop or a kill) over one :class:`FakeGateway` through interleavings of: new jobs,
reused stream names, appends, end markers, cancels with and without a reason, early
``finish()``, a hard kill (every Redis call of that consumer fails and its task is
cancelled; under ``SESSION`` its session then expires), graceful stops, restarts, and
one injected failure of any recovery, release or finishing call. Both liveness modes.

After every step:

* every entry a handler saw belongs to the job that handed it over (an entry carries
  its job's number, and so does the job's ``info``): no leftover, end marker or cancel
  of an earlier job of the same name reaches a later one;
* at most one consumer is inside ``handle()`` for a stream, except a killed one
  whose call is still unwinding;
* a cancelled job hands over at most one read batch more.

At quiescence (every consumer running, faults cleared, every open job closed): every
entry of every job that was neither cancelled nor finished early was handled (or
dead-lettered), and nothing is locked, leased, pending, indexed or marked.

The bounded run here is part of every test run. The long run:

    STREAMJOBS_MODEL_EXAMPLES=200 STREAMJOBS_MODEL_STEPS=30 \
        .venv/bin/python -m pytest tests/unit/test_seams_model.py -q -p no:logging

(no per-test timeout then; about 10 minutes per liveness mode on 2 cores).

Not modelled here (the fake has one service and no DLQ replay): two services on one
stream and replays; tests/integration/test_seams.py covers those against real Redis.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any, ClassVar

import anyio
import anyio.from_thread
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
)

from streamjobs import (
    ClusterMode,
    ConsumerConfig,
    Liveness,
    Message,
    RecoveryConfig,
    _ownership,
    _runtime,
)
from streamjobs._runtime import Runtime
from streamjobs.exceptions import RedisUnavailable
from tests.fakes.gateway import METHODS, FakeGateway
from tests.fakes.runtime import RecordingMetrics, Running

NAMES = ("a", "b")
CONSUMERS = ("c1", "c2")
BATCH = 4
CONFIG = ConsumerConfig(
    lock_ttl_s=0.6,
    read_block_ms=20,
    read_batch_size=BATCH,
    shutdown_grace_s=0.1,
    handler_backoff_s=0.01,
    handler_backoff_max_s=0.02,
    finished_stream_ttl_s=None,
)
RECOVERY = RecoveryConfig(
    min_idle_s=0.8, interval_s=0.3, lease_check_interval_s=0.1, max_retries=50
)
FAULTY = (
    "requeue",
    "release",
    "seal",
    "finish",
    "acquire",
    "fenced_read",
    "extend_many",
    "session",
    "lock_holder",
    "fetch_assignment",
    "dead_letter_assignment",
)
"""Calls a failure is injected into (once each time the rule runs)."""
QUIESCE_S = 20.0

EXAMPLES = int(os.environ.get("STREAMJOBS_MODEL_EXAMPLES", "5"))
STEPS = int(os.environ.get("STREAMJOBS_MODEL_STEPS", "12"))


@dataclasses.dataclass
class Job:
    number: int
    stream: str
    assignment: str
    appended: list[str] = dataclasses.field(default_factory=list)
    closed: bool = False
    truncated: bool = False  # cancelled or finished early: the rest may be skipped
    cancelled_at: int | None = None  # handled-count of the job when it was cancelled


class _Dead:
    """A consumer's view of the shared fake: every call fails once it is killed."""

    def __init__(self, fake: FakeGateway) -> None:
        self._fake = fake
        self.dead = False

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._fake, name)
        if name not in METHODS:
            return target

        async def call(*args: Any, **kwargs: Any) -> Any:
            if self.dead:
                raise RedisUnavailable("killed (model)")
            return await target(*args, **kwargs)

        return call


class _Hooks:
    def __init__(self, model: SeamsModel, consumer: str) -> None:
        self.model = model
        self.consumer = consumer

    async def handle(self, message: Message) -> None:
        self.model.entered(self.consumer, message)
        try:
            await anyio.sleep(0.002)
        finally:
            self.model.left(self.consumer, message)
        if message.fields.get("finish"):  # the producer's way of saying "that's enough"
            self.model.runtimes[self.consumer].finish(message.stream)

    async def on_stream_start(self, stream: str, info: Mapping[str, Any]) -> None:
        pass

    async def on_stream_end(self, stream: str) -> None:
        pass

    async def on_stream_lost(self, stream: str) -> None:
        pass

    async def on_stream_cancelled(self, stream: str, reason: str) -> None:
        pass


class SeamsModel(RuleBasedStateMachine):
    liveness: ClassVar[Liveness] = Liveness.LOCK

    def __init__(self) -> None:
        super().__init__()
        self._portal_cm: AbstractContextManager[anyio.from_thread.BlockingPortal] = (
            anyio.from_thread.start_blocking_portal()
        )
        self.portal = self._portal_cm.__enter__()
        self.fake = FakeGateway()
        self.views = {c: _Dead(self.fake) for c in CONSUMERS}
        config = dataclasses.replace(CONFIG, liveness=self.liveness)

        def build(consumer: str) -> Runtime:  # in the event loop: it makes anyio objects
            return Runtime(
                _Hooks(self, consumer),
                self.views[consumer],
                client=None,
                name=consumer,
                config=config,
                recovery=RECOVERY,
                cluster_mode=ClusterMode.PROXY,
                metrics=RecordingMetrics(),
            )

        self.runtimes = {c: self.portal.call(build, c) for c in CONSUMERS}
        self.running: dict[str, Running | None] = dict.fromkeys(CONSUMERS)
        self.state = dict.fromkeys(CONSUMERS, "running")  # running, stopped, killed
        self.jobs: dict[str, Job] = {}
        self.all_jobs: list[Job] = []
        self.handled: list[
            tuple[str, str, str, str, str]
        ] = []  # consumer, stream, id, job, info job
        self.inside: dict[str, set[str]] = {}
        self.killed: set[str] = set()
        self.violations: list[str] = []
        for c in CONSUMERS:
            self._start(c)

    # -- what the hooks report ---------------------------------------------------------

    def entered(self, consumer: str, message: Message) -> None:
        inside = self.inside.setdefault(message.stream, set())
        others = inside - {consumer}
        if others and not (others | {consumer}) & self.killed:
            self.violations.append(
                f"{consumer} entered handle() for {message.stream!r} while {others} were in it"
            )
        inside.add(consumer)
        job, info_job = message.fields.get("job", "?"), str(message.info.get("job", "?"))
        if job != info_job:
            self.violations.append(
                f"entry {message.id} of job {job} of {message.stream!r} was handed to job "
                f"{info_job} (by {consumer})"
            )

    def left(self, consumer: str, message: Message) -> None:
        self.inside.get(message.stream, set()).discard(consumer)
        self.handled.append(
            (
                consumer,
                message.stream,
                message.id,
                message.fields.get("job", "?"),
                str(message.info.get("job", "?")),
            )
        )

    # -- driving the runtimes ----------------------------------------------------------

    def _call(self, fn: Callable[[], Awaitable[Any]]) -> Any:
        return self.portal.call(fn)

    def _call_sync(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` in the event loop's thread, between two of its steps: the fake
        is not thread-safe, and the consumers run there."""
        return self.portal.call(functools.partial(fn, *args))

    def _start(self, consumer: str) -> None:
        handle = self.portal.call(Running, self.runtimes[consumer])
        self.views[consumer].dead = False
        self.killed.discard(consumer)
        self.portal.start_task(handle._run)
        self.running[consumer] = handle

    def _settle(self, seconds: float = 0.03) -> None:
        self._call(lambda: anyio.sleep(seconds))

    def _done(self, consumer: str) -> bool:
        handle = self.running[consumer]
        return handle is None or handle.done.is_set()

    # -- rules -------------------------------------------------------------------------

    @rule(name=st.sampled_from(NAMES))
    def new_job(self, name: str) -> None:
        """A new job of ``name``; a reused name once its previous job is over (the
        producer closes it first if it is still open). With no consumer running the
        previous job cannot end: then nothing happens."""
        previous = self.jobs.get(name)
        if previous is not None:
            if "running" not in self.state.values():
                return
            if not previous.closed and not previous.truncated:
                self._call_sync(self.fake.close, name)
                previous.closed = True
            self._wait(lambda: not self._named(name), f"job {previous.number} to end")
        number = len(self.all_jobs) + 1
        assignment, created = self._call_sync(self.fake.submit, name, {"job": number})
        assert created, "the previous job of this name is unfinished"
        job = Job(number, name, assignment)
        self.jobs[name] = job
        self.all_jobs.append(job)
        self._settle()

    def _named(self, name: str) -> bool:
        """Whether an assignment (queued, pending, or a re-queued copy) names ``name``."""
        return any(_text(f.get("stream", "")) == name for _, f in self.fake.lbs_entries)

    @precondition(lambda self: any(not j.closed and not j.truncated for j in self.jobs.values()))
    @rule(data=st.data(), count=st.integers(1, 6))
    def append(self, data: st.DataObject, count: int) -> None:
        open_jobs = [j for j in self.jobs.values() if not j.closed and not j.truncated]
        job = data.draw(st.sampled_from(open_jobs))
        for _ in range(count):
            k = len(job.appended)
            fields = {"job": str(job.number), "k": str(k)}
            job.appended.append(self._call_sync(self.fake.append, job.stream, fields))
        self._settle()

    @precondition(lambda self: any(not j.closed and not j.truncated for j in self.jobs.values()))
    @rule(data=st.data())
    def close(self, data: st.DataObject) -> None:
        open_jobs = [j for j in self.jobs.values() if not j.closed and not j.truncated]
        job = data.draw(st.sampled_from(open_jobs))
        self._call_sync(self.fake.close, job.stream)
        job.closed = True
        self._settle()

    @precondition(lambda self: any(not j.truncated for j in self.jobs.values()))
    @rule(data=st.data(), reason=st.sampled_from(["", "stop it"]))
    def cancel(self, data: st.DataObject, reason: str) -> None:
        """``Producer.cancel_stream`` of a job a consumer has read (signal_cancel.lua);
        with the default empty reason too."""
        jobs = [j for j in self.jobs.values() if not j.truncated]
        job = data.draw(st.sampled_from(jobs))
        job.truncated = True

        def cancel_stream() -> None:  # as Producer.cancel_stream does it
            job.cancelled_at = self._handled_count(job)
            if not self._named(job.stream):
                return  # over already: NOT_FOUND, nothing written
            if not self.fake.cancel_queued(job.stream):  # delivered: its owner ends it
                self.fake.signal_cancel(job.stream, reason)

        self._call_sync(cancel_stream)
        self._settle()

    @precondition(lambda self: any(not j.closed and not j.truncated for j in self.jobs.values()))
    @rule(data=st.data())
    def finish_early(self, data: st.DataObject) -> None:
        """An entry whose handler calls ``finish(stream)``: what follows may be skipped.
        (The producer appends nothing more to that job.)"""
        open_jobs = [j for j in self.jobs.values() if not j.closed and not j.truncated]
        job = data.draw(st.sampled_from(open_jobs))
        k = len(job.appended)
        fields = {"job": str(job.number), "k": str(k), "finish": "1"}
        job.appended.append(self._call_sync(self.fake.append, job.stream, fields))
        job.truncated = True
        self._settle()

    @rule(consumer=st.sampled_from(CONSUMERS))
    def kill(self, consumer: str) -> None:
        """kill -9: no call of it reaches Redis from now on, its task is cancelled;
        under SESSION its session expires (the fake keeps sessions until ended)."""
        if self.state[consumer] != "running":
            return
        self.state[consumer] = "killed"
        self.views[consumer].dead = True
        self.killed.add(consumer)
        handle = self.running[consumer]
        assert handle is not None
        self._call_sync(handle.cancel)
        self._call_sync(self.fake.sessions.pop, consumer, None)
        self._settle()

    @rule(consumer=st.sampled_from(CONSUMERS))
    def stop(self, consumer: str) -> None:
        if self.state[consumer] != "running":
            return
        self.state[consumer] = "stopped"
        self._call(self.runtimes[consumer].aclose)

    @rule(consumer=st.sampled_from(CONSUMERS))
    def restart(self, consumer: str) -> None:
        """run() again on the same object: a new session incarnation, a fresh stop."""
        if self.state[consumer] == "running":
            return
        self._wait(lambda: self._done(consumer), f"{consumer} to unwind")
        self._start(consumer)
        self.state[consumer] = "running"
        self._settle()

    @rule(method=st.sampled_from(FAULTY))
    def fail_once(self, method: str) -> None:
        self._call_sync(self.fake.fail, method, 1)
        self._settle()

    @rule()
    def wait(self) -> None:
        self._settle(0.2)

    # -- invariants --------------------------------------------------------------------

    @invariant()
    def nothing_crossed(self) -> None:
        assert not self.violations, self.violations

    @invariant()
    def cancel_within_one_batch(self) -> None:
        self._call_sync(self._cancels_honoured)

    def _cancels_honoured(self) -> None:
        for job in self.all_jobs:
            if job.cancelled_at is not None:
                extra = self._handled_count(job) - job.cancelled_at
                # One batch in hand, plus one call per consumer that may be in it.
                assert extra <= BATCH + 1, f"job {job.number} handled {extra} after its cancel"

    # -- helpers and the end -----------------------------------------------------------

    def _handled_count(self, job: Job) -> int:
        mine = set(job.appended)
        return sum(1 for _, s, i, _, _ in self.handled if s == job.stream and i in mine)

    def teardown(self) -> None:
        try:
            self._quiesce_and_check()
        finally:
            for c in CONSUMERS:
                handle = self.running[c]
                if handle is not None and not handle.done.is_set():
                    self.views[c].dead = False
                    self._call(self.runtimes[c].aclose)
            self._portal_cm.__exit__(None, None, None)

    def _quiesce_and_check(self) -> None:
        self._call_sync(self.fake.fail_clear)
        for c in CONSUMERS:
            self.restart(c)
        for job in self.jobs.values():
            if not job.closed and not job.truncated:
                self._call_sync(self.fake.close, job.stream)
                job.closed = True
        self._wait(
            lambda: not self.fake.lbs_entries and not self.fake.lbs_pending,
            "every assignment to finish",
        )
        self._wait(lambda: not self.fake.locks, "every lock to be released")
        self._call_sync(self._final_checks)

    def _final_checks(self) -> None:
        assert not self.violations, self.violations
        handled = {(s, i) for _, s, i, _, _ in self.handled}
        dead = {(f.get("_source_stream"), f.get("_source_id")) for _, f in self.fake.dead_letters}
        for job in self.all_jobs:
            if job.truncated:
                continue
            lost = [i for i in job.appended if (job.stream, i) not in handled | dead]
            assert not lost, f"job {job.number} of {job.stream!r}: entries never handled {lost}"
        assert self.fake.leases == {}, "a lease was left behind"
        assert self.fake.active == {}, "the active-assignment index kept an entry"
        assert self.fake.cancels == {}, "a cancel marker was left behind"
        for name in NAMES:
            assert self.fake.data_pending(name) == {}, f"{name!r} has pending entries"

    def _wait(self, check: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + QUIESCE_S
        while not self._call_sync(check):
            if time.monotonic() > deadline:
                raise AssertionError(f"not quiescent after {QUIESCE_S}s: {what}")
            self._settle(0.05)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


_SETTINGS = settings(
    max_examples=EXAMPLES,
    stateful_step_count=STEPS,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


class LockModel(SeamsModel):
    liveness = Liveness.LOCK


class SessionModel(SeamsModel):
    liveness = Liveness.SESSION


@pytest.mark.timeout(0 if "STREAMJOBS_MODEL_EXAMPLES" in os.environ else 600)
@pytest.mark.parametrize("model", [LockModel, SessionModel], ids=["lock", "session"])
def test_the_seams_model(model: type[SeamsModel], monkeypatch: pytest.MonkeyPatch) -> None:
    # A killed consumer's calls all fail at once, so its shielded clean-up only waits
    # out its bounds: shorter bounds keep each example short (the bounds are not what
    # is under test).
    for module in (_ownership, _runtime):
        monkeypatch.setattr(module, "CLEANUP_TIMEOUT_S", 0.3)
    model.TestCase.settings = _SETTINGS
    model.TestCase().runTest()
