"""The stateful model of a shared group (``GroupConsumer``, docs/shared-groups.md).

:class:`GroupModel` is a hypothesis ``RuleBasedStateMachine`` that drives two members
of one service's group (real ``GroupRuntime`` objects over the in-memory gateway, each
``run()`` again after a stop or a kill) on two streams, through interleavings of:
appends of entries the handler takes, refuses once (a retry) or rejects
(``DeadLetter``); a hard kill (every call of that consumer fails, its task is
cancelled, its sessions are left to expire); a stall past the session TTL (the
process is frozen: its sessions expire on the server and its own clock has moved
past them, but a ``handle()`` call in flight goes on when it wakes); graceful stops;
restarts; and one failing group step, before it runs or after (a lost reply).

After every step:

* an entry a handler saw was appended to that stream, with the fields it was
  appended with;
* at most one member is inside ``handle()`` for an entry, except one that was killed
  or stalled inside that call (the entry was reclaimed under it);
* a member whose session a stall ended hands nothing more (it joins again first);
* only an entry the handler rejected is dead-lettered.

At quiescence (faults cleared, every member running): every entry was handled or,
if rejected, dead-lettered; nothing is pending; and once every member has stopped, no
member of the group is alive in either stream's member index.

Every precondition reads the model's own state, never the system's timing, so that
hypothesis can replay and shrink what it finds.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from typing import Any

import anyio
import anyio.from_thread
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from streamjobs import (
    ConsumerConfig,
    DeadLetter,
    GroupRetention,
    Message,
    RecoveryConfig,
)
from streamjobs._group import GroupRuntime
from streamjobs._keys import Keys
from streamjobs._kind_runtime import Parts
from streamjobs.exceptions import RedisUnavailable
from tests.fakes.gateway import FakeGateway
from tests.fakes.groups import GROUP_METHODS
from tests.fakes.runtime import RecordingMetrics, Running

STREAMS = ("s1", "s2")
MEMBERS = ("m1", "m2")
KINDS = ("ok", "ok", "flaky", "reject", "stall")
"""What the handler does with an entry (its ``kind`` field): take it; refuse it once
(``ValueError`` on its first attempt, then take it); reject it (``DeadLetter``); take
it, its member stalled past the session TTL inside the call the first time."""
BATCH = 3
CONFIG = ConsumerConfig(
    lock_ttl_s=0.6,
    read_block_ms=20,
    read_batch_size=BATCH,
    shutdown_grace_s=0.1,
    handler_backoff_s=0.01,
    handler_backoff_max_s=0.02,
    max_handler_attempts=3,
)
RECOVERY = RecoveryConfig(min_idle_s=0.8, interval_s=0.2, max_retries=50)
FAULTY = (*sorted(GROUP_METHODS - {"groups.trim"}), "dead_letter_entry")
"""Steps a failure is injected into (the next call of it, by either member)."""
QUIESCE_S = 20.0


class _GroupView:
    """A member's view of the shared gateway: once it is killed, every call it makes
    fails (the process is gone) and nothing it sends reaches the fake."""

    def __init__(self, gateway: FakeGateway) -> None:
        self._gateway = gateway
        self.dead = False
        self.last_ok: float | None = None

    def __getattr__(self, name: str) -> Any:
        if name in ("groups", "assignments", "writes"):
            return _Calls(getattr(self._gateway, name), self)
        return getattr(self._gateway, name)


class _Calls:
    def __init__(self, target: Any, view: _GroupView) -> None:
        self._target = target
        self._view = view

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._target, name)
        if not callable(method):
            return method

        async def call(*args: Any, **kwargs: Any) -> Any:
            if self._view.dead:
                raise RedisUnavailable("killed (model)")
            return await method(*args, **kwargs)

        return call


class _Hooks:
    def __init__(self, model: GroupModel, member: str) -> None:
        self._model = model
        self._member = member

    async def handle(self, message: Message[Any]) -> None:
        self._model.entered(self._member, message)
        try:
            await anyio.sleep(0.002)  # a handler awaits: others run in between
            kind = message.fields.get("kind")
            if kind == "reject":
                raise DeadLetter("model reject")
            if kind == "flaky" and message.attempt == 1:
                raise ValueError("model: refused once")
            if kind == "stall" and (message.stream, message.id) not in self._model.stalled:
                self._model.stalled.add((message.stream, message.id))
                self._model.freeze(self._member)
        finally:
            self._model.left(self._member, message)
        self._model.handled.add((message.stream, message.id))

    async def on_startup(self) -> None:
        pass

    async def on_shutdown(self) -> None:
        pass


class GroupModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self._portal_cm: AbstractContextManager[anyio.from_thread.BlockingPortal] = (
            anyio.from_thread.start_blocking_portal()
        )
        self.portal = self._portal_cm.__enter__()
        self.fake = FakeGateway(Keys("model"))
        self.views = {m: _GroupView(self.fake) for m in MEMBERS}

        def build(member: str) -> GroupRuntime:  # in the event loop: it makes anyio objects
            parts = Parts(
                _Hooks(self, member),
                self.views[member],
                None,
                member,
                CONFIG,
                RECOVERY,
                RecordingMetrics(),
            )
            return GroupRuntime(
                parts,
                streams=STREAMS,
                start_id="0",
                cluster=False,
                retention=GroupRetention(interval_s=0.2),
            )

        self.runtimes = {m: self.portal.call(build, m) for m in MEMBERS}
        self.running: dict[str, Running | None] = dict.fromkeys(MEMBERS)
        self.state = dict.fromkeys(MEMBERS, "running")  # running, stopped, killed
        # What was appended: (stream, id) -> its fields.
        self.appended: dict[tuple[str, str], dict[str, str]] = {}
        self.handled: set[tuple[str, str]] = set()
        self.stalled: set[tuple[str, str]] = set()  # "stall" entries that stalled once
        # (stream, id) -> members inside handle() for it now.
        self.inside: dict[tuple[str, str], set[str]] = {}
        # (member, stream, id): inside handle() when that member was killed or stalled.
        self.excused: set[tuple[str, str, str]] = set()
        # Members (incarnations) whose session a stall ended: they hand nothing more.
        self.stale: set[str] = set()
        self.violations: list[str] = []
        for m in MEMBERS:
            self._start(m)

    # -- what the hooks report ---------------------------------------------------------

    def entered(self, member: str, message: Message[Any]) -> None:
        key = (message.stream, message.id)
        expected = self.appended.get(key)
        if expected is None:
            self.violations.append(f"{member} was handed {key}, never appended")
        elif dict(message.fields) != expected:
            self.violations.append(f"{key} handed with {message.fields}, not {expected}")
        lane = next(x for x in self.runtimes[member].lanes if x.stream == message.stream)
        if lane.member in self.stale:
            self.violations.append(
                f"{member} was handed {key} as {lane.member}, whose session was over"
            )
        inside = self.inside.setdefault(key, set())
        for other in inside - {member}:
            if (other, *key) not in self.excused:
                self.violations.append(
                    f"{member} entered handle() for {key} while {other} was in it"
                )
        inside.add(member)

    def left(self, member: str, message: Message[Any]) -> None:
        self.inside.get((message.stream, message.id), set()).discard(member)

    def _excuse(self, member: str) -> None:
        for key, members in self.inside.items():
            if member in members:
                self.excused.add((member, *key))

    # -- driving the runtimes ----------------------------------------------------------

    def _call(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        return self.portal.call(fn, *args)

    def _call_sync(self, fn: Callable[..., Any], *args: Any) -> Any:
        return self.portal.call(lambda: fn(*args))

    def _start(self, member: str) -> None:
        handle = self.portal.call(Running, self.runtimes[member])
        self.views[member].dead = False
        self.portal.start_task(handle._run)
        self.running[member] = handle

    def _settle(self, seconds: float = 0.03) -> None:
        self._call(anyio.sleep, seconds)

    def _done(self, member: str) -> bool:
        handle = self.running[member]
        return handle is None or handle.done.is_set()

    def _wait(self, check: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + QUIESCE_S
        while not self._call_sync(check):
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"not quiescent after {QUIESCE_S}s: {what}; {self._describe()}"
                )
            self._settle(0.05)

    def _describe(self) -> str:
        missing = sorted(k for k in self.appended if k not in self._settled())
        pending = {s: self.fake.groups.pending(s) for s in STREAMS}
        return f"unsettled {missing}; pending {pending}; members {self.fake.groups.members}"

    def _settled(self) -> set[tuple[str, str]]:
        dead = {(f["_source_stream"], f["_source_id"]) for _, f in self.fake.dead_letters}
        return self.handled | dead

    # -- rules -------------------------------------------------------------------------

    @rule(
        stream=st.sampled_from(STREAMS),
        kinds=st.lists(st.sampled_from(KINDS), min_size=1, max_size=6),
    )
    def append(self, stream: str, kinds: list[str]) -> None:
        def add() -> None:
            for i, kind in enumerate(kinds):
                fields = {"n": str(len(self.appended) + i), "kind": kind}
                self.appended[(stream, self.fake.append(stream, fields))] = fields

        self._call_sync(add)
        self._settle()

    @rule(member=st.sampled_from(MEMBERS))
    def kill(self, member: str) -> None:
        """kill -9: no call of it reaches Redis from now on, its task is cancelled; its
        sessions expire on the server after the TTL, as they would."""
        if self.state[member] != "running":
            return
        self.state[member] = "killed"
        self.views[member].dead = True
        self._call_sync(self._excuse, member)
        handle = self.running[member]
        assert handle is not None
        self._call_sync(handle.cancel)
        self._settle()

    @rule(member=st.sampled_from(MEMBERS))
    def stall(self, member: str) -> None:
        """SIGSTOP past the session TTL, then SIGCONT: its sessions are over on the
        server, and its clock has passed what it knew of them; the call in flight goes
        on (another member may reclaim that entry meanwhile)."""
        if self.state[member] != "running":
            return
        self._call_sync(self.freeze, member)
        self._settle()

    def freeze(self, member: str) -> None:
        """``member`` was frozen past the session TTL (in the event loop)."""
        self._excuse(member)
        now = self.fake.clock()
        for index in self.fake.groups.members.values():
            for name, deadline in index.items():
                if name.startswith(f"{member}~") and deadline > now:
                    index[name] = now
        for lane in self.runtimes[member].lanes:
            self.stale.add(lane.member)
            lane.alive_until = min(lane.alive_until, time.monotonic())

    @rule(member=st.sampled_from(MEMBERS))
    def stop(self, member: str) -> None:
        if self.state[member] != "running":
            return
        self.state[member] = "stopped"
        self._call(self.runtimes[member].life.aclose)

    @rule(member=st.sampled_from(MEMBERS))
    def restart(self, member: str) -> None:
        if self.state[member] == "running":
            return
        self._wait(lambda: self._done(member), f"{member} to unwind")
        self._start(member)
        self.state[member] = "running"
        self._settle()

    @rule(method=st.sampled_from(FAULTY), after=st.booleans())
    def fail_once(self, method: str, after: bool) -> None:
        self._call_sync(lambda: self.fake.fail(method, after=after))
        self._settle()

    @rule()
    def wait(self) -> None:
        self._settle(0.2)

    # -- invariants --------------------------------------------------------------------

    @invariant()
    def nothing_crossed(self) -> None:
        assert not self.violations, self.violations

    @invariant()
    def only_rejected_entries_are_dead_lettered(self) -> None:
        def check() -> None:
            for _, letter in self.fake.dead_letters:
                key = (letter["_source_stream"], letter["_source_id"])
                kind = self.appended.get(key, {}).get("kind")
                assert kind == "reject", f"{key} ({kind}) dead-lettered: {letter}"

        self._call_sync(check)

    # -- the end -----------------------------------------------------------------------

    def teardown(self) -> None:
        try:
            self._quiesce_and_check()
        finally:
            for m in MEMBERS:
                if not self._done(m):
                    self.views[m].dead = False
                    self._call(self.runtimes[m].life.aclose)
            self._portal_cm.__exit__(None, None, None)

    def _quiesce_and_check(self) -> None:
        self._call_sync(self.fake.fail_clear)
        for m in MEMBERS:
            self.restart(m)

        def quiet() -> bool:
            pending = sum(self.fake.groups.pending(s) for s in STREAMS)
            return not (self.appended.keys() - self._settled()) and pending == 0

        self._wait(quiet, "every entry handled or dead-lettered, and acknowledged")
        assert not self.violations, self.violations
        for m in MEMBERS:
            self._call(self.runtimes[m].life.aclose)

        def left() -> bool:
            now = self.fake.clock()
            return all(
                deadline <= now
                for index in self.fake.groups.members.values()
                for deadline in index.values()
            )

        self._wait(left, "every member to leave (or its session to expire)")


def run(examples: int, steps: int, *, derandomize: bool = False) -> None:
    """Run the model for ``examples`` examples of up to ``steps`` steps each
    (``derandomize``: the same examples every run, for the bounded run in the suite)."""
    GroupModel.TestCase.settings = settings(
        max_examples=examples,
        stateful_step_count=steps,
        deadline=None,
        derandomize=derandomize,
        database=None if derandomize else settings.default.database,
        suppress_health_check=[HealthCheck.too_slow],
    )
    GroupModel.TestCase().runTest()
