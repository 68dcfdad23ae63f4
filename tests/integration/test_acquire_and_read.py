"""The lock and the first read in one MULTI (``Gateway.acquire_and_read``), against
real Redis, standalone and cluster: what it returns in each case, and that a read
queued behind an acquire that failed is claimed by the owner, in order; a retried
acquire refreshes the lock's TTL."""

from __future__ import annotations

from typing import Any

import pytest

from streamjobs._keys import Keys
from streamjobs._redis import ACQUIRED, ACQUIRED_ENDED, NOT_ACQUIRED, Gateway
from streamjobs._wire import EOS_FIELD, EOS_VALUE

pytestmark = pytest.mark.anyio


async def _pending_of(redis: Any, stream: str, group: str) -> dict[str, int]:
    summary = await redis.xpending(stream, group)
    return {c["name"].decode(): int(c["pending"]) for c in summary["consumers"] or []}


async def _a_job_to_its_end(redis: Any, service: str, uid: str) -> tuple[Gateway, str, list[str]]:
    """A gateway (scripts loaded) and a data stream of two entries and the end marker."""
    gw = Gateway(redis, Keys(service))
    await gw.assignments.load_scripts()
    stream = f"data:{uid}"
    handled = [(await redis.xadd(stream, {"n": str(i)})).decode() for i in range(2)]
    handled.append((await redis.xadd(stream, {EOS_FIELD: EOS_VALUE})).decode())
    return gw, stream, handled


async def test_a_free_lock_is_taken_with_the_first_entries(
    redis: Any, service: str, uid: str
) -> None:
    gw = Gateway(redis, Keys(service))
    stream = f"data:{uid}"
    ids = [(await redis.xadd(stream, {"n": str(i)})).decode() for i in range(5)]

    taken, first = await gw.streams.acquire_and_read(stream, "c1:1", 5000, "job", "c1", 3)

    assert taken == ACQUIRED
    assert first is not None
    assert first.owned
    assert [(i, f["n"]) for i, f in first.entries] == [(ids[i], str(i)) for i in range(3)]
    assert await redis.get(gw.keys.lock(stream)) == b"c1:1"
    assert await _pending_of(redis, stream, gw.keys.group) == {"c1": 3}


async def test_an_empty_stream_gives_the_id_to_wait_after(
    redis: Any, service: str, uid: str
) -> None:
    gw = Gateway(redis, Keys(service))
    stream = f"data:{uid}"

    taken, first = await gw.streams.acquire_and_read(stream, "c1:1", 5000, "job", "c1", 10)

    assert taken == ACQUIRED
    assert first is not None
    assert (first.owned, first.entries, first.top) == (True, [], "0-0")


async def test_a_held_lock_leaves_the_read_to_the_owner_in_order(
    redis: Any, service: str, uid: str
) -> None:
    gw = Gateway(redis, Keys(service))
    await gw.assignments.load_scripts()  # as a consumer does at start: no NOSCRIPT retry below
    stream = f"data:{uid}"
    ids = [(await redis.xadd(stream, {"n": str(i)})).decode() for i in range(6)]
    assert await gw.streams.acquire(stream, "owner:1", 5000)
    owned = await gw.streams.fenced_read(stream, "owner:1", "owner", 2, [])
    assert [i for i, _ in owned.entries] == ids[:2]

    taken, first = await gw.streams.acquire_and_read(stream, "loser:1", 5000, "job", "loser", 2)

    assert (taken, first) == (NOT_ACQUIRED, None)
    assert await redis.get(gw.keys.lock(stream)) == b"owner:1"
    # The MULTI's XREADGROUP ran anyway: entries 2 and 3 are pending with the loser.
    assert await _pending_of(redis, stream, gw.keys.group) == {"owner": 2, "loser": 2}
    # The owner's next read acks its batch and sees them pending: it claims the oldest
    # pending entries (theirs, then what its own discarded read delivered), in order.
    nxt = await gw.streams.fenced_read(stream, "owner:1", "owner", 10, ids[:2])
    assert nxt.claimed
    assert [i for i, _ in nxt.entries] == ids[2:]
    done = await gw.streams.fenced_read(stream, "owner:1", "owner", 10, ids[2:])
    assert done.entries == []
    assert await _pending_of(redis, stream, gw.keys.group) == {}


async def test_a_cancelled_stream_and_an_ended_job(redis: Any, service: str, uid: str) -> None:
    gw = Gateway(redis, Keys(service))
    cancelled, ended = f"data:c:{uid}", f"data:e:{uid}"
    await redis.xadd(cancelled, {"n": "0"})
    await redis.set(gw.keys.cancel(cancelled), "stop")
    await redis.xadd(ended, {"n": "0"})
    await redis.set(gw.keys.ended(ended), "n job-1")

    taken, first = await gw.streams.acquire_and_read(cancelled, "c1:1", 5000, "job", "c1", 10)
    assert taken == ACQUIRED
    assert first is not None
    assert (first.cancelled, first.entries) == ("stop", [])

    taken, first = await gw.streams.acquire_and_read(ended, "c1:2", 5000, "job-1", "c1", 10)
    assert (taken, first) == (ACQUIRED_ENDED, None)
    assert await redis.get(gw.keys.lock(ended)) == b"c1:2"
    # After a normal end, what follows the end marker may be a later job's (one queued
    # without add_stream reads what is there): it stays pending, for that job's owner.
    assert await _pending_of(redis, ended, gw.keys.group) == {"c1": 1}


async def test_an_early_ended_job_leaves_nothing_pending(
    redis: Any, service: str, uid: str
) -> None:
    """The chaos soak's finding (cluster, seed 1429247653): a job ended early (a cancel,
    finish()) and its owner died before completing it; entries appended after its end
    belong to it. The acquisition that only completes the job must not leave them
    pending with itself: no later owner would claim them."""
    gw = Gateway(redis, Keys(service))
    stream = f"data:{uid}"
    await redis.xadd(stream, {"n": "0"})
    await redis.xgroup_create(stream, gw.keys.group, id="$")  # the owner read this far
    await redis.xadd(stream, {"n": "tail"})
    await redis.set(gw.keys.ended(stream), "e job-1")

    taken, first = await gw.streams.acquire_and_read(stream, "c1:1", 5000, "job-1", "c1", 10)

    assert (taken, first) == (ACQUIRED_ENDED, None)
    assert await _pending_of(redis, stream, gw.keys.group) == {}


@pytest.mark.parametrize("path", ["complete", "seal_then_release"])
async def test_entries_a_contender_read_past_the_end_are_not_left_pending(
    redis: Any, service: str, uid: str, path: str
) -> None:
    """A contender whose acquisition fails while the owner ends the job still read the
    entries after the end marker (they belong to the ended job, never to be handled),
    and they are pending with it. Completing the job acknowledges every entry still
    pending: in one script (a standalone server), and on a cluster in the seal and
    again in the release, since a contender can read between the two."""
    if path == "complete" and hasattr(redis, "get_node_from_key"):
        pytest.skip("complete.lua needs every key on one server")
    gw, stream, handled = await _a_job_to_its_end(redis, service, uid)
    assert await gw.streams.acquire(stream, "owner:1", 5000)
    read = await gw.streams.fenced_read(stream, "owner:1", "owner", 10, [])
    assert [i for i, _ in read.entries] == handled
    await redis.xadd(stream, {"n": "tail"})
    taken, _ = await gw.streams.acquire_and_read(stream, "rival:1", 5000, "job", "rival", 10)
    assert taken == NOT_ACQUIRED
    assert await _pending_of(redis, stream, gw.keys.group) == {"owner": 3, "rival": 1}

    if path == "complete":
        sealed, _ = await gw.completion.complete(stream, "owner:1", -1, "0-1", handled, job="job")
        assert sealed
    else:
        assert await gw.completion.seal(stream, "owner:1", -1, handled, job="job")
        assert await _pending_of(redis, stream, gw.keys.group) == {}
        await redis.xadd(stream, {"n": "tail 2"})  # a contender between seal and release
        taken, _ = await gw.streams.acquire_and_read(stream, "rival:2", 5000, "job", "rival", 10)
        assert taken == NOT_ACQUIRED
        assert await gw.completion.release(stream, "owner:1", -1, ended=True)
    assert await _pending_of(redis, stream, gw.keys.group) == {}


async def test_scripts_missing_on_the_server_are_loaded_again(
    redis_url: str, service: str, uid: str
) -> None:
    """A restarted or promoted server has no scripts (standalone only: SCRIPT FLUSH on
    the session's cluster would reach every other test's scripts)."""
    from redis.asyncio import Redis

    async with Redis.from_url(redis_url) as redis:
        gw = Gateway(redis, Keys(service))
        await gw.assignments.load_scripts()
        stream = f"data:{uid}"
        await redis.xadd(stream, {"n": "0"})
        await redis.script_flush()

        taken, first = await gw.streams.acquire_and_read(stream, "c1:1", 5000, "job", "c1", 10)

        assert taken == ACQUIRED
        assert first is not None
        assert [f["n"] for _, f in first.entries] == ["0"]
        assert await redis.script_exists(gw.scripts.acquire.sha, gw.scripts.fence.sha) == [
            True,
            True,
        ]


@pytest.mark.parametrize("lock", ["ended", "held", "free"])
async def test_a_read_after_the_lock_was_lost_leaves_nothing_behind(
    redis: Any, service: str, uid: str, lock: str
) -> None:
    """A stalled owner that reads once more after its lock was lost: its fence fails,
    but the XREADGROUP of the same MULTI still delivers the newest entries to it (the
    CI soak's finding, seed 720389469). If a job of the name has ended and no one holds
    the lock, they came after that end: acked, or they would stay pending for good.
    Otherwise they stay pending for the owner (``held``) or the next owner (``free``),
    who claims them in order."""
    gw, stream, handled = await _a_job_to_its_end(redis, service, uid)
    # The stalled owner read the first batch; its lock expired and the successor took
    # the stream over, claimed that batch and handled it.
    assert await gw.streams.acquire(stream, "stalled:1", 5000)
    assert [
        i for i, _ in (await gw.streams.fenced_read(stream, "stalled:1", "stalled", 2, [])).entries
    ]
    await redis.delete(gw.keys.lock(stream))
    assert await gw.streams.acquire(stream, "owner:1", 5000)
    claimed = await gw.streams.fenced_read(stream, "owner:1", "owner", 10, [], claim=True)
    assert [i for i, _ in claimed.entries] == handled[:2]
    rest = await gw.streams.fenced_read(stream, "owner:1", "owner", 10, handled[:2])
    assert [i for i, _ in rest.entries] == handled[2:]
    if lock == "ended":
        assert await gw.completion.seal(stream, "owner:1", -1, handled, job="job")
        assert await gw.completion.release(stream, "owner:1", -1, ended=True)
    elif lock == "free":  # the successor died too: its assignment is re-queued
        await redis.delete(gw.keys.lock(stream))
    tail = (await redis.xadd(stream, {"n": "tail"})).decode()

    stale = await gw.streams.fenced_read(stream, "stalled:1", "stalled", 10, [])

    assert not stale.owned
    if lock == "ended":
        assert await _pending_of(redis, stream, gw.keys.group) == {}
        return
    assert (await _pending_of(redis, stream, gw.keys.group))["stalled"] == 1
    if lock == "free":
        assert await gw.streams.acquire(stream, "owner:2", 5000)
        token, acked, unacked = "owner:2", [], [handled[2], tail]  # the dead one's too
    else:
        token, acked, unacked = "owner:1", handled[2:], [tail]
    nxt = await gw.streams.fenced_read(stream, token, "owner", 10, acked)
    assert [i for i, _ in nxt.entries] == unacked
    await gw.streams.fenced_read(stream, token, "owner", 10, unacked)
    assert await _pending_of(redis, stream, gw.keys.group) == {}


async def test_a_failing_settlement_of_a_stale_read_only_leaves_it_pending(
    redis: Any, service: str, uid: str, caplog: pytest.LogCaptureFixture
) -> None:
    """``stray.lua`` is best effort: when it fails, the read still reports the lock
    lost, the failure is one warning line, and the entries stay pending (as they did
    before it existed) for the next job of the name."""
    gw, stream, handled = await _a_job_to_its_end(redis, service, uid)
    assert await gw.streams.acquire(stream, "owner:1", 5000)
    await gw.streams.fenced_read(stream, "owner:1", "owner", 10, [])
    assert await gw.completion.seal(stream, "owner:1", -1, handled, job="job")
    assert await gw.completion.release(stream, "owner:1", -1, ended=True)
    await redis.xadd(stream, {"n": "tail"})

    async def unreachable(**_: Any) -> None:
        raise ConnectionError("Connection closed by server.")

    gw.scripts.stray = unreachable  # type: ignore[assignment]
    with caplog.at_level("WARNING", logger="streamjobs._redis._streams"):
        stale = await gw.streams.fenced_read(stream, "stalled:1", "stalled", 10, [])

    assert not stale.owned
    assert await _pending_of(redis, stream, gw.keys.group) == {"stalled": 1}
    [line] = [r.getMessage() for r in caplog.records]
    assert "settling 1 entries read after its lock was lost" in line


async def test_a_retried_acquire_refreshes_the_lock_ttl(redis: Any, service: str) -> None:
    gw = Gateway(redis, Keys(service))
    stream = f"data:{service}"
    assert await gw.streams.acquire(stream, "me:1", 5000)
    await redis.pexpire(Keys(service).lock(stream), 200)
    assert await gw.streams.acquire(stream, "me:1", 5000)  # a client retry finds its own token
    assert await redis.pttl(Keys(service).lock(stream)) > 4000
