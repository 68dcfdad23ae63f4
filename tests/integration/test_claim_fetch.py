"""A successor claims its predecessor's pending entries: the claimed ids' data comes
back complete and in order, however the pending ids are spread over the stream."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis as AsyncRedis

from streamjobs._keys import Keys
from streamjobs._redis import Gateway

pytestmark = pytest.mark.anyio


async def _taken_over(redis: AsyncRedis, gw: Gateway, stream: str, entries: int) -> None:
    """ "old" reads every entry of ``stream``, then its lock passes to "new"."""
    assert await gw.streams.acquire(stream, "old:1", 5000)
    assert (
        len((await gw.streams.fenced_read(stream, "old:1", "old", entries, [])).entries) == entries
    )
    await redis.set(gw.keys.lock(stream), "new:1")


async def test_claimed_entries_come_back_in_order_across_acked_gaps_and_deletions(
    redis: AsyncRedis, service: str, uid: str
) -> None:
    keys = Keys(service)
    gw = Gateway(redis, keys)
    stream = f"data:{uid}"
    ids = [await redis.xadd(stream, {"n": str(i)}) for i in range(300)]
    await _taken_over(redis, gw, stream, 300)
    # The old owner had acked a long run in the middle (more than one XRANGE over the
    # claimed span carries), and one pending entry was deleted since.
    await redis.xack(stream, keys.group, *ids[10:210])
    await redis.xdel(stream, ids[5])

    claimed = await gw.streams.fenced_read(stream, "new:1", "new", 300, [], claim=True)

    expected = [i for i in [*range(10), *range(210, 300)] if i != 5]
    assert claimed.owned
    assert claimed.claimed
    assert [f["n"] for _, f in claimed.entries] == [str(i) for i in expected]
    assert [e for e, _ in claimed.entries] == [ids[i].decode() for i in expected]
    summary = await redis.xpending(stream, keys.group)
    assert summary["pending"] == len(expected)
    assert {c["name"].decode(): c["pending"] for c in summary["consumers"]} == {
        "new": len(expected)
    }


async def test_a_contiguous_claim_comes_back_whole(
    redis: AsyncRedis, service: str, uid: str
) -> None:
    gw = Gateway(redis, Keys(service))
    stream = f"data:{uid}"
    for i in range(40):
        await redis.xadd(stream, {"n": str(i), "payload": "x" * 50})
    await _taken_over(redis, gw, stream, 40)

    claimed = await gw.streams.fenced_read(stream, "new:1", "new", 100, [], claim=True)

    assert [f["n"] for _, f in claimed.entries] == [str(i) for i in range(40)]
    assert claimed.largest_bytes == len("n") + len("39") + len("payload") + 50


async def test_a_claim_of_a_cancelled_stream_claims_nothing_and_says_so(
    redis: AsyncRedis, service: str, uid: str
) -> None:
    """A claim is a read too: once the stream is cancelled it hands nothing more on.
    (The soak met an owner that re-claimed a failing entry of a cancelled stream 953
    times: its lock re-check saw the cancel, but its next read was a claim, which did
    not look.) The acks it carries are still made."""
    gw = Gateway(redis, Keys(service))
    stream = f"data:{uid}"
    ids = [(await redis.xadd(stream, {"n": str(i)})).decode() for i in range(5)]
    await _taken_over(redis, gw, stream, 5)
    await redis.set(gw.keys.cancel(stream), "stop it")

    reply = await gw.streams.fenced_read(stream, "new:1", "new", 10, ids[:1], claim=True)

    assert (reply.owned, reply.entries, reply.cancelled) == (True, [], "stop it")
    pending = await redis.xpending(stream, gw.keys.group)
    assert pending["pending"] == 4, "the ack it carried was not made"
    assert {c["name"].decode(): c["pending"] for c in pending["consumers"]} == {"old": 4}
