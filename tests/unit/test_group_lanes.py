"""GroupConsumer's own logic over the in-memory gateway (tests/fakes/groups.py): entries
shared by the members of a group and each handled once, retries and dead letters
through the shared entry pipeline, a dead member's entries reclaimed by a live one,
an entry that keeps killing its consumers dead-lettered, and a failing call at each
group step losing nothing (docs/shared-groups.md). No server, no network."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import anyio
import pytest

from streamjobs import ConsumerConfig, GroupRetention, Message, NullRecorder, RecoveryConfig
from streamjobs._group import GroupRuntime
from streamjobs._keys import Keys
from streamjobs._kind_runtime import Parts
from tests.fakes.gateway import FakeGateway, _Delivery, _Group, parse_id
from tests.fakes.groups import GROUP_METHODS
from tests.fakes.runtime import eventually

pytestmark = pytest.mark.anyio

FAST = ConsumerConfig(
    lock_ttl_s=1.0,
    read_block_ms=20,
    read_batch_size=5,
    shutdown_grace_s=0.2,
    handler_backoff_s=0.01,
    handler_backoff_max_s=0.02,
    max_handler_attempts=2,
)
RECOVERY = RecoveryConfig(min_idle_s=2, max_retries=3)
STREAM = "jobs"
POISON = 7
"""The index of the entry the failing-step test's handlers always refuse."""

Behaviour = Callable[[Message], Awaitable[None]]


class Hooks:
    """Records every ``handle()`` call; ``behaviour`` runs first (it may raise)."""

    def __init__(self, behaviour: Behaviour | None = None) -> None:
        self.behaviour = behaviour
        self.calls: list[Message] = []
        self.handled: list[str] = []

    async def handle(self, message: Message) -> None:
        self.calls.append(message)
        if self.behaviour is not None:
            await self.behaviour(message)
        self.handled.append(message.id)

    async def on_startup(self) -> None:
        pass

    async def on_shutdown(self) -> None:
        pass


def group(
    fake: FakeGateway, hooks: Hooks, name: str, config: ConsumerConfig = FAST
) -> GroupRuntime:
    parts = Parts(hooks, fake, None, name, config, RECOVERY, NullRecorder())
    return GroupRuntime(
        parts,
        streams=[STREAM],
        start_id="0",
        cluster=False,
        retention=GroupRetention(interval_s=0.2),
    )


@asynccontextmanager
async def running(*runtimes: GroupRuntime) -> AsyncIterator[None]:
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            for runtime in runtimes:
                await tg.start(runtime.run)
            try:
                yield
            finally:
                for runtime in runtimes:
                    await runtime.life.aclose()


async def test_entries_are_shared_and_each_handled_once() -> None:
    fake = FakeGateway(Keys("svc"))
    first, second = Hooks(), Hooks()
    async with running(group(fake, first, "c0"), group(fake, second, "c1")):
        ids = fake.append_many(STREAM, 40)
        await eventually(lambda: len(first.handled) + len(second.handled) >= 40, "all handled")
        await eventually(lambda: fake.groups.pending(STREAM) == 0, "all acknowledged")
    handled = first.handled + second.handled
    assert sorted(handled, key=parse_id) == ids
    assert len(set(handled)) == len(handled), "an entry handled twice"
    assert fake.groups.registered == {STREAM}


async def test_a_failing_entry_is_retried_then_dead_lettered_once() -> None:
    async def refuse(message: Message) -> None:
        if message.fields.get("n") == "3":
            raise ValueError("cannot")

    fake = FakeGateway(Keys("svc"))
    hooks = Hooks(refuse)
    runtime = group(fake, hooks, "c0")
    async with running(runtime):
        ids = fake.append_many(STREAM, 6)
        await eventually(lambda: len(fake.dead_letters) == 1, "the dead letter")
        await eventually(lambda: fake.groups.pending(STREAM) == 0, "all acknowledged")
    (letter,) = [fields for _, fields in fake.dead_letters]
    assert (letter["_source_id"], letter["_group"]) == (ids[3], "svc")
    assert (letter["_dlq_reason"], letter["_attempts"]) == ("handler_failed", "2")
    assert [m.attempt for m in hooks.calls if m.id == ids[3]] == [1, 2]
    assert sorted(hooks.handled, key=parse_id) == ids[:3] + ids[4:]
    stats = runtime.statistics()
    assert stats.dead_letters == {"handler_failed": 1}
    assert stats.entries == {"ok": 5, "dead_lettered": 1}


async def test_a_dead_members_batch_goes_to_a_live_member() -> None:
    """The member that holds a batch dies (its session deadline passes on the server):
    the live member reclaims and handles the batch; the dead one acknowledges none."""
    fake = FakeGateway(Keys("svc"))
    holding, release = anyio.Event(), anyio.Event()

    async def hold(message: Message) -> None:
        if not holding.is_set():
            holding.set()
            await release.wait()

    stuck, live = Hooks(hold), Hooks()
    stuck_rt = group(fake, stuck, "c1")
    async with running(stuck_rt):
        ids = fake.append_many(STREAM, 5)
        with anyio.fail_after(5):
            await holding.wait()
        (member,) = [m for m in fake.groups.members[STREAM] if m.startswith("c1~")]
        fake.groups.members[STREAM][member] = 1  # its session is over on the server
        async with running(group(fake, live, "c0")):
            await eventually(lambda: len(live.handled) == 5, "the live member handles all")
            release.set()
            await eventually(lambda: stuck_rt.lanes[0].member != member, "the dead one rejoins")
            await eventually(lambda: fake.groups.pending(STREAM) == 0, "all acknowledged")
    assert sorted(live.handled, key=parse_id) == ids
    assert stuck_rt.statistics().stream_events.get("lost") == 1


async def test_an_entry_begun_too_often_is_dead_lettered_not_handled() -> None:
    """An entry pending under a dead member, begun ``max_retries`` times already: the
    next start would be one more, so it is dead-lettered (max_retries_exceeded)."""
    fake = FakeGateway(Keys("svc"))
    (entry,) = fake.append_many(STREAM, 1)
    stream = fake._data[STREAM]
    stream.group = _Group(last_delivered=parse_id(entry))
    stream.group.pel[entry] = _Delivery("ghost~1", 0)
    fake.groups.members[STREAM] = {"ghost~1": 1}
    fake.groups.starts[STREAM] = {entry: RECOVERY.max_retries}
    hooks = Hooks()
    async with running(group(fake, hooks, "c0")):
        await eventually(lambda: len(fake.dead_letters) == 1, "the dead letter")
        await eventually(lambda: fake.groups.pending(STREAM) == 0, "acknowledged")
    (letter,) = [fields for _, fields in fake.dead_letters]
    assert (letter["_dlq_reason"], letter["_retry_count"]) == ("max_retries_exceeded", "4")
    assert hooks.calls == []
    assert fake.groups.starts[STREAM] == {}


@pytest.mark.parametrize("after", [False, True], ids=["before", "after"])
@pytest.mark.parametrize("method", sorted(GROUP_METHODS))
async def test_a_failing_call_at_each_group_step_loses_nothing(method: str, after: bool) -> None:
    """Each group step fails its first two calls, before its effect or after it (the
    reply lost). Two members share a stream with a poison entry; the session of one
    ends while it holds a batch, so that the other reclaims it (history, restart
    counts), and then it stops (leave). Every entry is handled, the poison one
    dead-lettered exactly once, nothing left pending."""
    fake = FakeGateway(Keys("svc"))
    fake.fail(method, times=2, after=after)
    holding, release = anyio.Event(), anyio.Event()

    async def poison(message: Message) -> None:
        if message.fields.get("n") == str(POISON):
            raise ValueError("poison")

    async def hold_then_poison(message: Message) -> None:
        if not holding.is_set():
            holding.set()
            await release.wait()
        await poison(message)

    first, second = Hooks(poison), Hooks(hold_then_poison)
    stopping = group(fake, second, "c1")
    ids: list[str] = []
    async with running(group(fake, first, "c0"), stopping):
        while not holding.is_set():  # until the second member holds a batch
            ids += fake.append_many(STREAM, 5, start=len(ids))
            with anyio.move_on_after(0.05):
                await holding.wait()
        member = stopping.lanes[0].member
        fake.groups.members[STREAM][member] = 1  # its session is over on the server
        good = {entry_id for i, entry_id in enumerate(ids) if i != POISON}

        def handled() -> set[str]:
            return set(first.handled + second.handled)

        await eventually(lambda: handled() >= good, "reclaimed and handled", timeout_s=15)
        release.set()
        await stopping.life.aclose()  # leaving: what it read again goes on at once
        ids += fake.append_many(STREAM, 10, start=len(ids))
        good = {entry_id for i, entry_id in enumerate(ids) if i != POISON}
        await eventually(lambda: handled() >= good, "all handled", timeout_s=15)
        await eventually(lambda: fake.groups.pending(STREAM) == 0, "all acknowledged")
        if method != "groups.leave":  # (once per member, at its stop: checked below)
            await eventually(lambda: fake._faults[method].times == 0, f"{method} failed twice")
    assert fake._faults[method].times == 0, f"{method} did not fail twice"
    assert [f["_source_id"] for _, f in fake.dead_letters] == [ids[POISON]], "dead-lettered once"
    assert fake.groups.starts.get(STREAM, {}) == {}
