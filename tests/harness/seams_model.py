"""The stateful model of where features meet (the seams), run over two worlds.

:class:`SeamsModel` is a hypothesis ``RuleBasedStateMachine`` that drives two consumers
(real ``Runtime`` objects, each ``run()`` again after a stop or a kill) through
interleavings of: new jobs, reused stream names, appends, end markers, cancels with and
without a reason, early ``finish()``, a hard kill (every Redis call of that consumer
fails and its task is cancelled; under ``SESSION`` its session then expires), graceful
stops, restarts, a stalled owner's last read (a fenced read with a lock token its
consumer no longer holds), and one injected failure of any recovery, release or
finishing call.

The world they run in is a :class:`World`: :class:`FakeWorld` (the in-memory gateway,
tests/model/test_seams_model.py) or :class:`RedisWorld` (real Redis and the real
scripts, tests/model/test_seams_model_redis.py).

After every step:

* every entry a handler saw belongs to the job that handed it over (an entry carries
  its job's number, and so does the job's ``info``): no leftover, end marker or cancel
  of an earlier job of the same name reaches a later one;
* at most one consumer is inside ``handle()`` for a stream, except a killed one whose
  call is still unwinding;
* a cancelled job hands over at most one read batch more.

At quiescence (every consumer running, faults cleared, every open job closed): every
entry of every job that was neither cancelled nor finished early was handled (or
dead-lettered), and nothing is locked, leased, pending, indexed or marked.

Every precondition reads the model's own state, never the system's timing, so that
hypothesis can replay and shrink what it finds.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any, ClassVar, Protocol

import anyio
import anyio.from_thread
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from streamjobs import (
    ClusterMode,
    ConsumerConfig,
    DeadLetter,
    DeadLetterFilter,
    DeadLetters,
    Liveness,
    Message,
    Producer,
    RecoveryConfig,
    _intake,
    _runtime,
    _runtime_liveness,
    _stream_end,
    _stream_state,
)
from streamjobs._keys import Keys
from streamjobs._kind_runtime import Parts
from streamjobs._redis import Gateway
from streamjobs._runtime import Runtime
from streamjobs.exceptions import RedisUnavailable
from tests.fakes.gateway import METHODS, FakeGateway, RawFieldsView
from tests.fakes.runtime import RecordingMetrics, Running

GROUPS = ("assignments", "streams", "completion", "liveness", "writes")
"""The command groups of ``Gateway`` (``FakeGateway`` plays them all itself)."""
NAMES = ("a", "b")
CONSUMERS = ("c1", "c2")
IN_BYTES_MODE = frozenset({"c2"})
"""Consumers whose ``handle()`` gets fields as bytes (``StreamConsumer[bytes]``)."""
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
    "acquire_and_read",
    "fenced_read",
    "extend_many",
    "session",
    "lock_holder",
    "fetch_assignment",
    "dead_letter_assignment",
    "take_leases",
    "complete",
)
"""Calls a failure is injected into (once each time the rule runs)."""
QUIESCE_S = 20.0


@dataclasses.dataclass
class Job:
    number: int
    stream: str
    assignment: str
    appended: list[str] = dataclasses.field(default_factory=list)
    closed: bool = False
    truncated: bool = False  # cancelled or finished early: the rest may be skipped
    cancelled_at: int | None = None  # handled-count of the job when it was cancelled


class View:
    """A consumer's view of the shared gateway: every call fails once it is killed, and
    the next call of a method named in ``faults`` (shared by all views) fails once.
    Each lock it takes is noted in ``tokens`` as ``(stream, token, consumer)``."""

    def __init__(
        self,
        gateway: Any,
        faults: set[str],
        consumer: str = "",
        tokens: list[tuple[str, str, str]] | None = None,
    ) -> None:
        self._gateway = gateway
        self._faults = faults
        self._consumer = consumer
        self._tokens = tokens
        self.dead = False
        self._dead_of: View | None = None  # a group's view dies with its gateway's

    def __getattr__(self, name: str) -> Any:
        if name in GROUPS:
            # A command group of the real gateway: the same view over it, so that its
            # calls fail as the view's do.
            view = View(getattr(self._gateway, name), self._faults, self._consumer, self._tokens)
            view._dead_of = self
            return view
        target = getattr(self._gateway, name)
        if name not in METHODS:
            return target

        async def call(*args: Any, **kwargs: Any) -> Any:
            if self.dead or (self._dead_of is not None and self._dead_of.dead):
                raise RedisUnavailable("killed (model)")
            if name in self._faults:
                self._faults.discard(name)
                raise RedisUnavailable(f"injected: {name} failed (model)")
            result = await target(*args, **kwargs)
            if name in ("acquire", "acquire_and_read") and self._tokens is not None:
                taken = result[0] if name == "acquire_and_read" else result
                if taken:
                    self._tokens.append((args[0], args[1], self._consumer))
            return result

        return call


class World(Protocol):
    """Where the consumers run; every method runs in the event loop."""

    client: Any
    cluster_mode: ClusterMode
    faults: set[str]

    def gateway(self, raw: bool = False) -> Any:
        """The gateway a consumer uses; ``raw``: one in bytes mode."""
        ...

    def stream(self, name: str) -> str: ...
    async def submit(self, name: str, info: Mapping[str, Any]) -> tuple[str, bool]: ...
    async def append(self, name: str, fields: Mapping[str, str]) -> str: ...
    async def close(self, name: str) -> None: ...
    async def cancel(self, name: str, reason: str) -> None: ...
    async def expire_session(self, consumer: str) -> None: ...
    async def named(self, name: str) -> bool: ...
    async def quiet(self) -> bool: ...
    async def leftovers(self) -> list[str]: ...
    async def dead_sources(self) -> set[tuple[str, str]]: ...
    async def replay(self) -> int:
        """Replay the dead letters the handler rejected (``REJECT``); how many are left
        unreplayed (-1: this world has no DLQ replay)."""
        ...


REJECT = "model reject"
"""The reason the handler gives ``DeadLetter`` for an entry marked ``reject`` that is
not a replayed copy."""


class FakeWorld:
    """The in-memory gateway (tests/fakes/gateway.py)."""

    client: Any = None
    cluster_mode = ClusterMode.PROXY

    def __init__(self) -> None:
        self.fake = FakeGateway()
        self.faults: set[str] = set()

    def gateway(self, raw: bool = False) -> Any:
        return RawFieldsView(self.fake) if raw else self.fake

    def stream(self, name: str) -> str:
        return name

    async def submit(self, name: str, info: Mapping[str, Any]) -> tuple[str, bool]:
        return self.fake.submit(name, info)

    async def append(self, name: str, fields: Mapping[str, str]) -> str:
        return self.fake.append(name, fields)

    async def close(self, name: str) -> None:
        self.fake.close(name)

    async def cancel(self, name: str, reason: str) -> None:
        self.fake.cancel(name, reason)

    async def expire_session(self, consumer: str) -> None:
        self.fake.sessions.pop(consumer, None)

    async def named(self, name: str) -> bool:
        return any(_text(f.get("stream", "")) == name for _, f in self.fake.lbs_entries)

    async def quiet(self) -> bool:
        fake = self.fake
        return not fake.lbs_entries and not fake.lbs_pending and not fake.locks

    def describe(self) -> str:
        """What is left, for a failure message."""
        fake = self.fake
        return (
            f"assignments {fake.lbs_entries}, pending {fake.lbs_pending}, locks "
            f"{fake.locks}, sessions {fake.sessions}, leases {fake.leases}, "
            f"active {fake.active}, cancel markers {fake.cancels}, ended {fake.ended}, "
            f"data { ({n: fake.data_entries(n) for n in NAMES}) }, "
            f"assignment history {fake.lbs_history}, dead letters {fake.dead_letters}"
        )

    async def leftovers(self) -> list[str]:
        fake = self.fake
        out = []
        if fake.leases:
            out.append(f"leases {fake.leases}")
        if fake.active:
            out.append(f"active-assignment index {fake.active}")
        if fake.cancels:
            out.append(f"cancel markers {fake.cancels}")
        out += [f"{n!r} pending {fake.data_pending(n)}" for n in NAMES if fake.data_pending(n)]
        return out

    async def dead_sources(self) -> set[tuple[str, str]]:
        return {
            (f.get("_source_stream", ""), f.get("_source_id", ""))
            for _, f in self.fake.dead_letters
        }

    async def replay(self) -> int:
        return -1  # the in-memory gateway has no DLQ replay


class RedisWorld:
    """A real Redis server and the real scripts; names carry the test's ``uid``."""

    cluster_mode = ClusterMode.NONE

    def __init__(self, client: Any, service: str, uid: str) -> None:
        self.client = client
        self.keys = Keys(service)
        self.service = service
        self.uid = uid
        self.real = Gateway(client, self.keys)
        self.real_raw = Gateway(client, self.keys)
        self.real_raw.raw_fields = True
        self.producer = Producer(client, service=service)
        self.faults: set[str] = set()

    def gateway(self, raw: bool = False) -> Any:
        return self.real_raw if raw else self.real

    def stream(self, name: str) -> str:
        return f"model:{self.uid}:{name}"

    async def submit(self, name: str, info: Mapping[str, Any]) -> tuple[str, bool]:
        # Created means an id that was not queued before: not a count of the queue, which
        # the consumers change meanwhile (one finishing another job hid a new one).
        before = {_text(i) for i, _ in await self.client.xrange(self.keys.assignments)}
        assignment = await self.producer.add_stream(self.stream(name), info)
        return assignment, assignment not in before

    async def append(self, name: str, fields: Mapping[str, str]) -> str:
        return await self.producer.append(self.stream(name), dict(fields))

    async def close(self, name: str) -> None:
        await self.producer.close_stream(self.stream(name))

    async def cancel(self, name: str, reason: str) -> None:
        await self.producer.cancel_stream(self.stream(name), reason)

    async def expire_session(self, consumer: str) -> None:
        await self.client.delete(self.keys.session(consumer))

    async def named(self, name: str) -> bool:
        stream = self.stream(name).encode()
        entries = await self.client.xrange(self.keys.assignments)
        return any(f.get(b"stream") == stream for _, f in entries or [])

    async def quiet(self) -> bool:
        keys = self.keys
        if await self.client.xlen(keys.assignments):
            return False
        return not any([await self.client.exists(keys.lock(self.stream(n))) for n in NAMES])

    async def leftovers(self) -> list[str]:
        keys, r = self.keys, self.client
        out = []
        if await r.zcard(keys.leases):
            out.append("leases left")
        if await r.hlen(keys.active):
            out.append(f"active-assignment index {await r.hgetall(keys.active)}")
        for n in NAMES:
            s = self.stream(n)
            if await r.exists(keys.cancel(s)):
                out.append(f"cancel marker of {s!r}")
            if await r.exists(s):
                # No group at all is possible: a job cancelled before any owner took its
                # stream (the cancel's marker entry made the stream).
                groups = [g for g in await r.xinfo_groups(s) if _text(g["name"]) == self.service]
                pending = groups[0]["pending"] if groups else 0
                if pending:
                    out.append(f"{s!r} has {pending} pending")
        return out

    async def dead_sources(self) -> set[tuple[str, str]]:
        entries = await self.client.xrange(self.keys.dead_letters)
        return {
            (_text(f.get(b"_source_stream", b"")), _text(f.get(b"_source_id", b"")))
            for _, f in entries or []
        }

    async def replay(self) -> int:
        letters = DeadLetters(self.client, service=self.service)
        await letters.replay(DeadLetterFilter(reason=REJECT))
        return len(await letters.list(reason=REJECT))


class _Hooks:
    def __init__(self, model: SeamsModel, consumer: str) -> None:
        self.model = model
        self.consumer = consumer

    async def handle(self, message: Message[Any]) -> None:
        if self.consumer in IN_BYTES_MODE:
            # What the framework hands a consumer in bytes mode, checked, then seen as
            # text like the other consumer's.
            if not all(type(k) is bytes and type(v) is bytes for k, v in message.fields.items()):
                self.model.violations.append(f"{self.consumer} got {message.fields!r}")
            fields = {k.decode(): v.decode() for k, v in message.fields.items()}
            message = message._replace(fields=fields)
        if message.fields.get("reject") and message.replayed_from is None:
            raise DeadLetter(reason=REJECT)  # a replay of it is handled
        self.model.entered(self.consumer, message)
        try:
            await anyio.sleep(0.002)
        finally:
            self.model.left(self.consumer, message)
        if message.fields.get("finish"):  # the producer's way of saying "that's enough"
            self.model.runtimes[self.consumer].finish(message.stream)

    async def on_startup(self) -> None:
        pass

    async def on_shutdown(self) -> None:
        pass

    async def on_stream_start(self, stream: str, info: Mapping[str, Any]) -> None:
        pass

    async def on_stream_end(self, stream: str) -> None:
        pass

    async def on_stream_lost(self, stream: str) -> None:
        pass

    async def on_stream_cancelled(self, stream: str, reason: str) -> None:
        pass


class SeamsModel(RuleBasedStateMachine):
    """Subclasses set ``liveness`` and ``make_world`` (called in the event loop)."""

    liveness: ClassVar[Liveness] = Liveness.LOCK
    make_world: ClassVar[Callable[[], Awaitable[World]]]
    close_world: ClassVar[Callable[[World], Awaitable[None]] | None] = None

    def __init__(self) -> None:
        super().__init__()
        self._portal_cm: AbstractContextManager[anyio.from_thread.BlockingPortal] = (
            anyio.from_thread.start_blocking_portal()
        )
        self.portal = self._portal_cm.__enter__()
        self.world: World = self.portal.call(type(self).make_world)
        # Every lock a consumer took: (stream, token, consumer), for stalled_read.
        self.tokens: list[tuple[str, str, str]] = []
        self.views = {
            c: View(self.world.gateway(raw=c in IN_BYTES_MODE), self.world.faults, c, self.tokens)
            for c in CONSUMERS
        }
        config = dataclasses.replace(CONFIG, liveness=self.liveness)

        def build(consumer: str) -> Runtime:  # in the event loop: it makes anyio objects
            parts = Parts(
                _Hooks(self, consumer),
                self.views[consumer],
                self.world.client,
                consumer,
                config,
                RECOVERY,
                RecordingMetrics(),
            )
            return Runtime(parts, cluster_mode=self.world.cluster_mode)

        self.runtimes = {c: self.portal.call(build, c) for c in CONSUMERS}
        self.running: dict[str, Running | None] = dict.fromkeys(CONSUMERS)
        self.state = dict.fromkeys(CONSUMERS, "running")  # running, stopped, killed
        self.jobs: dict[str, Job] = {}
        self.all_jobs: list[Job] = []
        # (consumer, stream, entry id, the entry's job, the job that handled it)
        self.handled: list[tuple[str, str, str, str, str]] = []
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
        # A replayed copy stands for the entry it came from.
        for entry_id in filter(None, (message.id, message.replayed_from)):
            self.handled.append(
                (
                    consumer,
                    message.stream,
                    entry_id,
                    message.fields.get("job", "?"),
                    str(message.info.get("job", "?")),
                )
            )

    # -- driving the runtimes ----------------------------------------------------------

    def _call(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        """``await fn(*args)`` in the event loop, where the consumers run (the fake is
        not thread-safe, and a client belongs to its loop)."""
        return self.portal.call(fn, *args)

    def _call_sync(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` in the event loop's thread, between two of its steps."""
        return self.portal.call(lambda: fn(*args))

    def _start(self, consumer: str) -> None:
        handle = self.portal.call(Running, self.runtimes[consumer])
        self.views[consumer].dead = False
        self.killed.discard(consumer)
        self.portal.start_task(handle._run)
        self.running[consumer] = handle

    def _settle(self, seconds: float = 0.03) -> None:
        self._call(anyio.sleep, seconds)

    def _done(self, consumer: str) -> bool:
        handle = self.running[consumer]
        return handle is None or handle.done.is_set()

    def _wait(self, check: Callable[[], Awaitable[bool]], what: str) -> None:
        deadline = time.monotonic() + QUIESCE_S
        while not self._call(check):
            if time.monotonic() > deadline:
                describe = getattr(self.world, "describe", None)
                state = self._call_sync(describe) if describe is not None else ""
                running = {c: not self._done(c) for c in CONSUMERS}
                owned = self._call_sync(self._owned_states)
                raise AssertionError(
                    f"not quiescent after {QUIESCE_S}s: {what}; running {running}; "
                    f"owned {owned}; {state}"
                )
            self._settle(0.05)

    def _owned_states(self) -> dict[str, dict[str, dict[str, Any]]]:
        """What each consumer's owned streams are doing, for a failure message."""
        fields = ("acquired", "lost", "ending", "finish_requested", "cancel_reason", "handling")
        return {
            c: {
                s: {f: getattr(o, f, "?") for f in fields}
                for s, o in getattr(self.runtimes[c], "owned", {}).items()
            }
            for c in CONSUMERS
        }

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
                self._call(self.world.close, name)
                previous.closed = True

            async def over() -> bool:
                return not await self.world.named(name)

            self._wait(over, f"job {previous.number} to end")
        number = len(self.all_jobs) + 1
        assignment, created = self._call(self.world.submit, name, {"job": number})
        assert created, "the previous job of this name is unfinished"
        job = Job(number, self.world.stream(name), assignment)
        self.jobs[name] = job
        self.all_jobs.append(job)
        self._settle()

    def _open_jobs(self) -> list[tuple[str, Job]]:
        return [(n, j) for n, j in self.jobs.items() if not j.closed and not j.truncated]

    def _unclosed_jobs(self) -> list[tuple[str, Job]]:
        return [(n, j) for n, j in self.jobs.items() if not j.closed]

    @precondition(lambda self: bool(self._unclosed_jobs()))
    @rule(data=st.data(), count=st.integers(1, 6), reject=st.booleans())
    def append(self, data: st.DataObject, count: int, reject: bool) -> None:
        """Entries for a job; also for one that ended early (cancelled, or finished by
        its handler), whose producer does not know: they belong to that job, never to
        the next job of the name. With ``reject`` the first one is dead-lettered by its
        handler until a replay puts it back."""
        name, job = data.draw(st.sampled_from(self._unclosed_jobs()))
        for i in range(count):
            fields = {"job": str(job.number), "k": str(len(job.appended))}
            if reject and i == 0:
                fields["reject"] = "1"
            job.appended.append(self._call(self.world.append, name, fields))
        self._settle()

    @rule()
    def replay(self) -> None:
        """``DeadLetters.replay`` of the rejected entries (worlds with a DLQ replay):
        each goes back to its own job, or waits while a later job of its name runs."""
        self._call(self.world.replay)
        self._settle()

    @precondition(lambda self: bool(self._open_jobs()))
    @rule(data=st.data())
    def close(self, data: st.DataObject) -> None:
        name, job = data.draw(st.sampled_from(self._open_jobs()))
        self._call(self.world.close, name)
        job.closed = True
        self._settle()

    @precondition(lambda self: any(not j.truncated for j in self.jobs.values()))
    @rule(data=st.data(), reason=st.sampled_from(["", "stop it"]))
    def cancel(self, data: st.DataObject, reason: str) -> None:
        """``Producer.cancel_stream``, with the default empty reason too."""
        jobs = [(n, j) for n, j in self.jobs.items() if not j.truncated]
        name, job = data.draw(st.sampled_from(jobs))
        job.truncated = True

        async def cancel_stream() -> None:
            job.cancelled_at = self._handled_count(job)
            await self.world.cancel(name, reason)

        self._call(cancel_stream)
        self._settle()

    @precondition(lambda self: bool(self._open_jobs()))
    @rule(data=st.data())
    def finish_early(self, data: st.DataObject) -> None:
        """An entry whose handler calls ``finish(stream)``: what follows may be skipped."""
        name, job = data.draw(st.sampled_from(self._open_jobs()))
        fields = {"job": str(job.number), "k": str(len(job.appended)), "finish": "1"}
        job.appended.append(self._call(self.world.append, name, fields))
        job.truncated = True
        self._settle()

    @rule(consumer=st.sampled_from(CONSUMERS))
    def kill(self, consumer: str) -> None:
        """kill -9: no call of it reaches Redis from now on, its task is cancelled;
        under SESSION its session expires (as it would after one lock TTL)."""
        if self.state[consumer] != "running":
            return
        self.state[consumer] = "killed"
        self.views[consumer].dead = True
        self.killed.add(consumer)
        handle = self.running[consumer]
        assert handle is not None
        self._call_sync(handle.cancel)
        if self.liveness is Liveness.SESSION:
            self._call(self.world.expire_session, consumer)
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

        async def done() -> bool:
            return self._done(consumer)

        self._wait(done, f"{consumer} to unwind")
        self._start(consumer)
        self.state[consumer] = "running"
        self._settle()

    @rule(pick=st.integers(0, 1000))
    def stalled_read(self, pick: int) -> None:
        """A stalled owner's last read: one more fenced read with a lock token its
        consumer held once, sent after that lock went (a pause past the lease between
        the lease check and the send). Its fence fails; the XREADGROUP behind it still
        delivers the newest entries to that consumer's name. Which tokens exist depends
        on the system's timing, so the rule draws a number, not a token: what hypothesis
        generates must not depend on it."""
        if not self.tokens:
            return
        stream, token, consumer = self.tokens[pick % len(self.tokens)]
        gateway = self.world.gateway(raw=consumer in IN_BYTES_MODE)

        async def read() -> None:
            if await gateway.liveness.lock_holder(stream) == token:
                return  # still held with it: not a stalled owner
            reply = await gateway.streams.fenced_read(stream, token, consumer, BATCH, [])
            assert not reply.owned, f"a read with {token!r}, no longer the lock's, passed"

        self._call(read)
        self._settle()

    @rule(method=st.sampled_from(FAULTY))
    def fail_once(self, method: str) -> None:
        self._call_sync(self.world.faults.add, method)
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

    def _handled_count(self, job: Job) -> int:
        mine = set(job.appended)
        return sum(1 for _, s, i, _, _ in self.handled if s == job.stream and i in mine)

    # -- the end -----------------------------------------------------------------------

    def teardown(self) -> None:
        try:
            self._quiesce_and_check()
        finally:
            for c in CONSUMERS:
                handle = self.running[c]
                if handle is not None and not handle.done.is_set():
                    self.views[c].dead = False
                    self._call(self.runtimes[c].aclose)
            close_world = type(self).close_world
            if close_world is not None:
                self._call(close_world, self.world)
            self._portal_cm.__exit__(None, None, None)

    def _quiesce_and_check(self) -> None:
        self._call_sync(self.world.faults.clear)
        for c in CONSUMERS:
            self.restart(c)
        for name, job in self.jobs.items():
            if not job.closed and not job.truncated:
                self._call(self.world.close, name)
                job.closed = True
        self._wait(self.world.quiet, "every assignment to finish and every lock to go")

        async def replayed() -> bool:  # a replay waits while a later job of its name runs
            return await self.world.replay() <= 0 and await self.world.quiet()

        self._wait(replayed, "every rejected entry to be replayed and handled")
        assert not self.violations, self.violations
        handled = {(s, i) for _, s, i, _, _ in self.handled}
        dead = self._call(self.world.dead_sources)
        for job in self.all_jobs:
            if job.truncated:
                continue
            lost = [i for i in job.appended if (job.stream, i) not in handled | dead]
            assert not lost, f"job {job.number} of {job.stream!r}: entries never handled {lost}"
        left = self._call(self.world.leftovers)
        assert not left, f"left behind at quiescence: {left}"


def run(
    model: type[SeamsModel],
    examples: int,
    steps: int,
    monkeypatch: Any,
    *,
    derandomize: bool = False,
) -> None:
    """Run ``model`` for ``examples`` examples of up to ``steps`` steps each
    (``derandomize``: the same examples every run, for the bounded run in the suite).

    A killed consumer's calls all fail at once, so its shielded clean-up only waits out
    its bounds: shorter bounds (``monkeypatch``) keep each example short; the bounds are
    not what is under test.
    """
    for module in (_stream_state, _stream_end, _runtime, _runtime_liveness, _intake):
        monkeypatch.setattr(module, "CLEANUP_TIMEOUT_S", 0.3)
    model.TestCase.settings = settings(
        max_examples=examples,
        stateful_step_count=steps,
        deadline=None,
        derandomize=derandomize,
        database=None if derandomize else settings.default.database,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    model.TestCase().runTest()


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
