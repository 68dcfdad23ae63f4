"""The in-memory gateway behaves like the scripts it stands in for (streamjobs/lua/*.lua).

The life-cycle and cancellation tests are only as good as this fake; these pin the
script semantics they rely on.
"""

from __future__ import annotations

import time

import anyio
import pytest

from streamjobs._deadletter import DEAD_AT_FIELD
from streamjobs._keys import Keys
from streamjobs._redis import Pending, StreamGateway
from streamjobs._redis._protocol import AssignmentOps, CompletionOps, LivenessOps, StreamOps
from streamjobs._wire import FIRST_ID_FIELD, RETRY_FIELD
from streamjobs.exceptions import InvalidStreamName, NoSuchGroup, RedisUnavailable
from tests.fakes.gateway import METHODS, FakeGateway, ManualClock

pytestmark = pytest.mark.anyio


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def fake(clock: ManualClock) -> FakeGateway:
    return FakeGateway(Keys("svc"), clock=clock)


def test_fake_is_a_stream_gateway() -> None:
    gateway: StreamGateway = FakeGateway()  # mypy checks the structural conformance
    groups = (AssignmentOps, StreamOps, CompletionOps, LivenessOps)
    protocol = {n for group in groups for n in dir(group) if not n.startswith("_")}
    assert protocol == METHODS
    for name in ("assignments", "streams", "completion", "liveness"):
        assert getattr(gateway, name) is gateway, "the fake plays every command group"
    assert all(callable(getattr(gateway, n)) for n in METHODS)
    assert gateway.keys.service == "svc"


async def test_acquire_extend_and_expiry(fake: FakeGateway, clock: ManualClock) -> None:
    assert await fake.acquire("d", "t1", 1000)
    assert await fake.acquire("d", "t1", 1000), "a retry with our own token succeeds"
    assert not await fake.acquire("d", "t2", 1000)
    assert fake.data_exists("d"), "MKSTREAM"
    clock.advance(900)
    assert await fake.extend_many([("d", "t1"), ("d", "t2"), ("e", "t1")], 1000) == [
        True,
        False,
        False,
    ]
    clock.advance(900)
    assert await fake.lock_exists("d")
    clock.advance(100)
    assert not await fake.lock_exists("d")
    assert await fake.extend_many([("d", "t1")], 1000) == [False], "never re-created"
    assert await fake.acquire("d", "t2", 1000)
    fake.expire_lock("d")
    assert fake.locks == {}
    with pytest.raises(InvalidStreamName):
        await fake.acquire("a}b", "t", 1000)


async def test_fenced_read_is_token_checked_and_pending_first(fake: FakeGateway) -> None:
    ids = fake.append_many("d", 4)
    assert await fake.acquire("d", "t1", 1000)
    assert (await fake.fenced_read("d", "t1", "c1", 2, []))[:4] == (
        True,
        "0-0",
        [(ids[0], {"n": "0"}), (ids[1], {"n": "1"})],
        2,
    )
    # Refused: nothing acked, but the XREADGROUP behind the fence delivered the rest.
    assert (await fake.fenced_read("d", "other", "c1", 10, ids))[:4] == (False, "", [], 0)
    assert list(fake.data_pending("d")) == ids, "a refused call acked something"
    # A new owner gets the pending entries first, in order.
    fake.expire_lock("d")
    assert await fake.acquire("d", "t2", 1000)
    ok, _, batch, *_ = await fake.fenced_read("d", "t2", "c2", 2, [])
    assert ok
    assert [i for i, _ in batch] == ids[:2]
    assert fake.data_pending("d") == {ids[0]: "c2", ids[1]: "c2", ids[2]: "c1", ids[3]: "c1"}
    # Ack and read in one call; count 0 only acks.
    assert (await fake.fenced_read("d", "t2", "c2", 0, ids[:1]))[:4] == (True, "0-0", [], 0)
    ok, _, batch, *_ = await fake.fenced_read("d", "t2", "c2", 10, ids[1:2])
    assert [i for i, _ in batch] == ids[2:]
    assert (await fake.fenced_read("d", "t2", "c2", 10, ids[2:]))[:4] == (True, ids[3], [], 0)
    assert fake.data_acked("d") == ids


async def test_a_refused_read_after_a_job_ended_leaves_nothing_pending(
    fake: FakeGateway,
) -> None:
    """stray.lua: what a read behind a failed fence delivered is acked when no one
    holds the lock and a job of the name ended; else it stays for the next owner."""
    [first] = fake.append_many("d", 1)
    assert await fake.acquire("d", "t1", 1000)
    assert (await fake.fenced_read("d", "t1", "c1", 10, []))[2] == [(first, {"n": "0"})]
    assert await fake.seal("d", "t1", -1, [first], job="job")
    assert await fake.release("d", "t1", -1, ended=True)
    [tail] = fake.append_many("d", 1)
    assert not (await fake.fenced_read("d", "t1", "c1", 10, [])).owned
    assert fake.data_pending("d") == {}
    fake.ended.clear()  # a job of the name started since: the next owner's
    [later] = fake.append_many("d", 1)
    assert not (await fake.fenced_read("d", "t1", "c1", 10, [])).owned
    assert fake.data_pending("d") == {later: "c1"}
    assert tail not in fake.data_pending("d")


async def test_wait_for_entries_blocks_until_a_newer_entry(fake: FakeGateway) -> None:
    [first] = fake.append_many("d", 1)
    started = time.monotonic()
    await fake.wait_for_entries("d", first, 30)
    assert time.monotonic() - started >= 0.03
    with anyio.fail_after(5):
        await fake.wait_for_entries("d", "0-0", 10_000)  # already there
        async with anyio.create_task_group() as tg:
            tg.start_soon(fake.wait_for_entries, "d", first, 10_000)
            await anyio.wait_all_tasks_blocked()
            fake.append("d", {"n": "x"})


async def test_read_assignments(fake: FakeGateway) -> None:
    a1 = fake.add_assignment("d1")
    with pytest.raises(NoSuchGroup):
        await fake.read_assignments("c1", 10, 10)
    await fake.ensure_group()
    await fake.ensure_group()
    assert await fake.read_assignments("c1", 10, 10) == [(a1, {"stream": "d1", "info": "{}"})]
    assert await fake.read_assignments("c1", 10, 10) == [], "never its own pending ones"
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            got: list[str] = []

            async def read() -> None:
                got.extend(i for i, _ in await fake.read_assignments("c2", 10, 10_000))

            tg.start_soon(read)
            await anyio.wait_all_tasks_blocked()
            a2 = fake.add_assignment("d2")
    assert got == [a2]
    assert fake.lbs_pending == {a1: "c1", a2: "c2"}
    assert await fake.pending_owner(a1) == "c1"
    assert await fake.pending_owner("1-1") == ""


async def test_requeue(fake: FakeGateway) -> None:
    await fake.ensure_group()
    a1 = fake.add_assignment("d1", x="y")
    a2 = fake.add_assignment("d2", **{RETRY_FIELD: "1"})
    await fake.read_assignments("c1", 10, 10)
    await fake.record_leases([a1, a2], 1000, new=True)
    n1 = await fake.requeue(a1, None)
    assert n1 is not None
    n2 = await fake.requeue(a2, 2)
    assert n2 is not None
    assert fake.lbs_entries == [
        (n1, {"stream": "d1", "info": "{}", "x": "y", FIRST_ID_FIELD: a1}),
        (n2, {"stream": "d2", "info": "{}", RETRY_FIELD: "2", FIRST_ID_FIELD: a2}),
    ]
    assert fake.leases == {}
    assert fake.lbs_pending == {}
    assert fake.lbs_undelivered == [n1, n2]
    assert await fake.requeue(a1, 5) is None, "no longer pending"
    assert await fake.requeue(n1, 5) is None, "never delivered"


async def test_finish_and_dead_letters(fake: FakeGateway) -> None:
    await fake.ensure_group()
    a1 = fake.add_assignment("d1")
    a2 = fake.add_assignment("d2", extra="kept", _dlq_reason="replaced")
    await fake.read_assignments("c1", 10, 10)
    await fake.record_leases([a1, a2], 1000, new=True)
    assert await fake.finish(a1)
    assert not await fake.finish(a1)
    await fake.record_leases([a1, a2], 1000, new=False)
    assert list(fake.leases) == [a2], "a heartbeat brought a finished lease back"
    moved = await fake.dead_letter_assignment(a2, [("_dlq_reason", "unparseable"), ("m", "1")])
    assert moved is not None
    assert await fake.dead_letter_assignment(a2, []) is None
    entry = await fake.dead_letter_entry([("f", "v")])
    assert fake.lbs_entries == []
    assert fake.leases == {}
    [(_, assignment_letter), (entry_id, entry_letter)] = fake.dead_letters
    assert entry_id == entry[0]
    dead_at = assignment_letter.pop(DEAD_AT_FIELD)
    assert dead_at.isdigit()
    assert assignment_letter == {
        "stream": "d2",
        "info": "{}",
        "extra": "kept",
        "_dlq_reason": "unparseable",
        "m": "1",
    }
    assert set(entry_letter) == {"f", DEAD_AT_FIELD}


async def test_submit_and_the_active_index(fake: FakeGateway, clock: ManualClock) -> None:
    """add.lua, and the index kept by finish.lua, requeue.lua and dead_letter_assignment.lua."""
    await fake.ensure_group()
    first, created = fake.submit("d1", {"job": 1})
    assert created
    assert fake.submit("d1", {"job": 2}) == (first, False), "unfinished: not yet read"
    raw = fake.add_assignment("d1")  # by other means: not deduplicated, not indexed
    await fake.read_assignments("c1", 10, 10)
    assert fake.submit("d1") == (first, False), "unfinished: pending"
    assert fake.active == {"d1": first}
    moved = await fake.requeue(first, 1)
    assert moved is not None
    assert fake.active == {"d1": moved}, "the index follows a re-queue"
    assert fake.submit("d1") == (moved, False)
    raw_moved = await fake.requeue(raw, None)
    assert raw_moved is not None
    assert fake.active == {"d1": moved}, "another assignment of the stream moved the index"
    await fake.read_assignments("c1", 10, 10)
    assert await fake.finish(raw_moved)
    assert fake.active == {"d1": moved}
    assert await fake.finish(moved)
    assert fake.active == {}
    second, created = fake.submit("d1", idempotency_key="k", window_ms=1000)
    assert created
    assert second != first
    await fake.read_assignments("c1", 10, 10)
    assert await fake.dead_letter_assignment(second, [("_dlq_reason", "manual")]) is not None
    assert fake.active == {}
    assert fake.submit("d1", idempotency_key="k") == (second, False), "within the window"
    assert fake.lbs_entries == []
    clock.advance(1000)
    third, created = fake.submit("d1", idempotency_key="k")
    assert created
    assert third not in (first, second)
    assert fake.active == {"d1": third}


async def test_dead_letter_stream_is_capped(clock: ManualClock) -> None:
    fake = FakeGateway(clock=clock, dlq_maxlen=2)
    assert [(await fake.dead_letter_entry([("n", str(i))]))[1] for i in range(4)] == [0, 0, 1, 1]
    assert [f["n"] for _, f in fake.dead_letters] == ["2", "3"]


async def test_release_retention(fake: FakeGateway, clock: ManualClock) -> None:
    ids = fake.append_many("d", 2)
    assert await fake.acquire("d", "t", 1000)
    await fake.fenced_read("d", "t", "c", 10, [])
    assert not await fake.release("d", "other", 0, ids)
    assert len(fake.data_pending("d")) == 2
    assert await fake.release("d", "t", 5000, ids[:1])
    assert fake.locks == {}
    assert list(fake.data_pending("d")) == ids[1:]
    assert fake.data_ttl_ms("d") == 5000
    clock.advance(5000)
    assert not fake.data_exists("d")
    fake.append_many("e", 1)
    assert await fake.acquire("e", "t", 1000)
    assert await fake.release("e", "t", 0)
    assert not fake.data_exists("e")
    fake.append_many("f", 1)
    assert await fake.acquire("f", "t", 1000)
    assert await fake.release("f", "t", -1)
    assert fake.data_ttl_ms("f") is None


async def test_sweep_and_scan_views(fake: FakeGateway, clock: ManualClock) -> None:
    await fake.ensure_group()
    ids = [fake.add_assignment(f"d{i}") for i in range(3)]
    await fake.read_assignments("c1", 2, 10)
    clock.advance(100)
    await fake.read_assignments("c2", 2, 10)
    await fake.record_leases(ids[:2], 1000, new=True)
    assert await fake.pending_page(0, "-", 10) == [
        Pending(ids[0], "c1"),
        Pending(ids[1], "c1"),
        Pending(ids[2], "c2"),
    ]
    assert await fake.pending_page(50, "-", 10) == [Pending(ids[0], "c1"), Pending(ids[1], "c1")]
    assert await fake.pending_page(0, f"({ids[0]}", 1) == [Pending(ids[1], "c1")]
    assert await fake.lease_scores(ids) == [clock() + 1000, clock() + 1000, None]
    assert await fake.sweep_leases(0, 10, 500) == []
    deadline = clock() + 1000
    clock.advance(1000)
    assert await fake.sweep_leases(0, 1, 500) == [(ids[0], deadline)]
    assert await fake.lease_scores(ids[:1]) == [clock() + 500]
    assert await fake.server_time_ms() == clock()


async def test_gate_before_the_effect_cancels_cleanly(fake: FakeGateway) -> None:
    gate = fake.gate("acquire")
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(fake.acquire, "d", "t", 1000)
            await gate.entered.wait()
            assert gate.waiting == 1
            tg.cancel_scope.cancel()
    assert fake.locks == {}, "a call cancelled before its effect had one"
    gate.release()
    assert await fake.acquire("d", "t", 1000)
    assert gate.calls == 2


async def test_gate_after_the_effect_holds_only_the_reply(fake: FakeGateway) -> None:
    gate = fake.gate("acquire", after=True)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(fake.acquire, "d", "t", 1000)
            await gate.entered.wait()
            assert fake.locks == {"d": "t"}
            tg.cancel_scope.cancel()
    assert fake.locks == {"d": "t"}


async def test_faults(fake: FakeGateway) -> None:
    fake.fail("acquire", times=2)
    for _ in range(2):
        with pytest.raises(RedisUnavailable):
            await fake.acquire("d", "t", 1000)
    assert fake.locks == {}
    fake.fail("acquire", after=True)
    with pytest.raises(RedisUnavailable):
        await fake.acquire("d", "t", 1000)
    assert fake.locks == {"d": "t"}, "a lost reply still ran"
    assert await fake.acquire("d", "t", 1000)
    assert [c[1] for c in fake.calls_of("acquire")] == ["t"] * 4
    with pytest.raises(ValueError, match="not a StreamGateway method"):
        fake.gate("acquier")
