"""The end of a stream's completion, against real Redis: an owner that never gets to
release its lock leaves one that lives only the short lock TTL, and a lost reply to the
final release still finishes the stream (the runtime's side over the in-memory
gateway: tests/unit/test_stream_completion.py)."""

from __future__ import annotations

from typing import Any, TypeVar

import pytest
from redis.asyncio import Redis as AsyncRedis

from streamjobs import ClusterMode, Producer, RecoveryConfig
from streamjobs._keys import Keys
from streamjobs._redis import Gateway
from streamjobs._redis._completion import CompletionCommands
from streamjobs.exceptions import RedisUnavailable
from streamjobs.metrics import StreamEvent
from tests.harness.plugin import ConsumerFactory

from ._helpers import SESSION, Recorder, eventually, true

pytestmark = pytest.mark.anyio


def _three_steps(redis: Any) -> ClusterMode:
    """The cluster mode in which a stream is completed in three calls (seal, finish,
    release): a cluster's own, else PROXY (every mode but NONE)."""
    return ClusterMode.OSS if hasattr(redis, "get_node_from_key") else ClusterMode.PROXY


_REPLACE = "redis.call('DEL', KEYS[1]); return redis.call('SET', KEYS[1], ARGV[1])"


class _CannotRelease(CompletionCommands):
    """Real Redis, but every ``release`` fails: as an owner killed after its assignment
    went and before its lock did."""

    async def release(self, *args: Any, **kwargs: Any) -> bool:
        raise RedisUnavailable("injected: release failed")


def _gateway_that_cannot_release(*args: Any, **kwargs: Any) -> Gateway:
    gateway = Gateway(*args, **kwargs)
    gateway.completion = _CannotRelease(gateway)
    return gateway


@pytest.mark.parametrize("path", ["finished", "dead_lettered"])
async def test_a_lock_left_after_its_assignment_went_lives_only_the_short_ttl(
    redis: AsyncRedis, service: str, uid: str, consumer_factory: ConsumerFactory,
    monkeypatch: pytest.MonkeyPatch, path: str,
) -> None:  # fmt: skip
    """Under SESSION a lock lives 10 minutes. An owner that completes (or dead-letters)
    its assignment and never gets to release the lock must not leave one that long:
    nothing points at it any more, so no recovery would remove it. Before the
    assignment goes, the lock is cut to ``lock_ttl_s`` (docs/design.md#sessions)."""
    import streamjobs._base_consumer

    monkeypatch.setattr(streamjobs._base_consumer, "Gateway", _gateway_that_cannot_release)
    keys = Keys(service)
    stream = f"d:{uid}"
    producer = Producer(redis, service=service)
    await producer.add_stream(stream)
    await producer.append(stream, {"n": "0"})
    if path == "finished":
        await producer.close_stream(stream)
    # On one server (ClusterMode.NONE) a finish is one script with no window between
    # its steps; PROXY mode takes the three steps a cluster takes.
    mode = {} if path == "dead_lettered" else {"cluster_mode": _three_steps(redis)}
    c = consumer_factory(Recorder, config=SESSION, recovery=RecoveryConfig(interval_s=30), **mode)
    assert SESSION.session_lock_ttl_ms >= 600_000

    async def assignment_gone_lock_left() -> bool:
        return await redis.xlen(keys.assignments) == 0 and bool(
            await redis.exists(keys.lock(stream))
        )

    async with c:
        if path == "dead_lettered":
            await eventually(lambda: true(len(c.handled) == 1))
            # Unusable while owned: its next read fails for good, the assignment goes
            # to the dead-letter stream.
            # Replaced at once (one script), so that its owner's next read meets the
            # string, whichever wait woke it.
            await redis.eval(_REPLACE, 1, stream, "not a stream")
        await eventually(assignment_gone_lock_left)
        ttl = await redis.pttl(keys.lock(stream))
        assert 0 < ttl <= 1000, f"the lock keeps {ttl} ms (lock_ttl_s is 1 s)"
        assert await redis.xlen(keys.dead_letters) == (path == "dead_lettered")
        assert [n for _, _, _, n in c.handled] == ["0"]

    async def lock_gone() -> bool:
        return not await redis.exists(keys.lock(stream))

    await eventually(lock_gone, timeout_s=5)


_T = TypeVar("_T")


class _LastReplyLost(CompletionCommands):
    """Real Redis, but the reply to the call that releases a finished stream's lock
    (``complete`` on one server, ``release`` after seal and finish on a cluster) is
    lost once: the call was carried out, the caller sees a dropped connection."""

    lost = 0

    async def complete(self, *args: Any, **kwargs: Any) -> tuple[bool, bool]:
        done = await super().complete(*args, **kwargs)
        return self._lose(done)

    async def release(self, *args: Any, **kwargs: Any) -> bool:
        done = await super().release(*args, **kwargs)
        return self._lose(done)

    def _lose(self, done: _T) -> _T:
        if not type(self).lost:
            type(self).lost += 1
            raise RedisUnavailable("injected: connection lost after the call")
        return done


def _gateway_losing_a_last_reply(*args: Any, **kwargs: Any) -> Gateway:
    gateway = Gateway(*args, **kwargs)
    gateway.completion = _LastReplyLost(gateway)
    return gateway


async def test_a_lost_reply_to_the_final_release_still_finishes_the_stream(
    redis: AsyncRedis, service: str, uid: str, consumer_factory: ConsumerFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """The retry finds the lock gone because the lost call released it: the stream is
    finished (``on_stream_end``), not lost, and nothing is left behind."""
    import streamjobs._base_consumer

    monkeypatch.setattr(_LastReplyLost, "lost", 0)
    monkeypatch.setattr(streamjobs._base_consumer, "Gateway", _gateway_losing_a_last_reply)
    keys = Keys(service)
    stream = f"d:{uid}"
    producer = Producer(redis, service=service)
    await producer.add_stream(stream)
    await producer.append(stream, {"n": "0"})
    await producer.close_stream(stream)
    c = consumer_factory(Recorder, config=SESSION)
    async with c:
        await eventually(lambda: true(c.ended == [stream]))
    assert _LastReplyLost.lost == 1, "the fault was not met"
    assert c.lost == []
    assert [n for _, _, _, n in c.handled] == ["0"]
    assert await redis.xlen(keys.assignments) == 0
    assert not await redis.exists(keys.lock(stream))
    assert await redis.zcard(keys.leases) == 0
    assert c.statistics().stream_events.get(StreamEvent.FINISHED.value) == 1
