"""A ``GroupConsumer`` whose Redis calls fail at each step in turn, against real Redis
(docs/shared-groups.md): each method of the gateway's group commands (joining, listing
the stream for status, the acknowledgement and read of a batch, a history read, the
restart counter, an acknowledgement alone, the heartbeat, the reclaim pass, trimming,
leaving) and the dead-letter write. Each step fails its first two
calls, either before the command reaches the server or after the server applied it
(the reply lost). Two consumers share a stream
with a poison entry; the session of one of them ends while it holds a batch, so that
the other reclaims it, and then it stops. After each: every entry handled, the poison
entry dead-lettered exactly once, nothing pending, no restart counter left."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from streamjobs import ConsumerConfig, GroupConsumer, GroupRetention, Message, RecoveryConfig
from streamjobs._keys import Keys
from streamjobs.group import group_runtime_of
from tests.harness.plugin import cluster_mode_for

from ._helpers import eventually, true

pytestmark = pytest.mark.anyio

GROUP_STEPS = (
    "join",
    "register",
    "ack_and_read",
    "history",
    "count_start",
    "ack",
    "beat",
    "reclaim",
    "trim",
    "leave",
)
"""The methods of ``gateway.groups``: every Redis call of a group consumer but one."""
STEPS = (*GROUP_STEPS, "dead_letter_entry")

ENTRIES = 60
POISON = 7


class Faults:
    """Fails calls number ``fail_on`` of one step: ``before`` sending it, or ``after``
    the server answered (its effect applied, its reply lost)."""

    def __init__(self, mode: str, fail_on: tuple[int, ...] = (1, 2)) -> None:
        self.mode = mode
        self.fail_on = fail_on
        self.calls = 0
        self.failed = 0

    def wrap(self, fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        @functools.wraps(fn)
        async def call(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            failing = self.calls in self.fail_on
            if failing and self.mode == "before":
                self.failed += 1
                raise RedisConnectionError("injected: the command never reached the server")
            result = await fn(*args, **kwargs)
            if failing:
                self.failed += 1
                raise RedisConnectionError("injected: the server applied it, the reply was lost")
            return result

        return call


class Worker(GroupConsumer):
    """``hold``: the first call waits for ``release``, so the consumer holds its batch."""

    def __init__(self, *args: Any, hold: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.handled: list[str] = []
        self.hold = hold
        self.holding = anyio.Event()
        self.release = anyio.Event()

    async def handle(self, message: Message) -> None:
        if self.hold and not self.holding.is_set():
            self.holding.set()
            await self.release.wait()
        if message.fields.get("poison"):
            raise ValueError("poison")
        await anyio.sleep(0.005)  # handling takes a moment, as real work does
        self.handled.append(message.id)


def inject(consumer: Worker, step: str, faults: Faults) -> None:
    gateway = group_runtime_of(consumer).gateway
    target = gateway.groups if step in GROUP_STEPS else gateway.assignments
    setattr(target, step, faults.wrap(getattr(target, step)))


@pytest.mark.parametrize("mode", ["before", "after"])
@pytest.mark.parametrize("step", STEPS)
async def test_a_failing_call_at_each_step_loses_nothing(
    redis: Any, service: str, uid: str, step: str, mode: str
) -> None:
    stream = f"g:{uid}"
    keys = Keys(service)
    faults = Faults(mode)
    config = ConsumerConfig(
        lock_ttl_s=1.0,
        read_block_ms=100,
        read_batch_size=5,
        max_handler_attempts=2,
        handler_backoff_s=0.01,
    )

    def make(name: str, hold: bool = False) -> Worker:
        return Worker(
            redis,
            hold=hold,
            service=service,
            streams=[stream],
            consumer_name=name,
            cluster_mode=cluster_mode_for(redis),
            config=config,
            recovery=RecoveryConfig(max_retries=5, min_idle_s=2),
            retention=GroupRetention(interval_s=0.2),
        )

    first, second = make("c0"), make("c1", hold=True)
    inject(first, step, faults)
    inject(second, step, faults)
    ids: list[str] = []

    def handled() -> set[str]:
        return {*first.handled, *second.handled}

    async with anyio.create_task_group() as tg:
        await tg.start(first.run)
        await tg.start(second.run)
        while len(ids) < ENTRIES:  # until the second consumer holds a batch
            for i in range(len(ids), len(ids) + 5):
                fields = {"n": str(i), **({"poison": "1"} if i == POISON else {})}
                ids.append((await redis.xadd(stream, fields)).decode())
            with anyio.move_on_after(0.1):
                await second.holding.wait()
        assert second.holding.is_set(), "the second consumer never got a batch"
        # Its session ends on the server while it holds the batch: the first consumer
        # reclaims the batch (a history read, the restart counter of each entry).
        member = group_runtime_of(second).lanes[0].member
        await redis.zadd(keys.members(stream), {member: 1})
        good = {entry_id for i, entry_id in enumerate(ids) if i != POISON}
        await eventually(lambda: true(handled() >= good), timeout_s=30)
        second.release.set()  # its call returns; its acknowledgement is refused
        # A graceful stop (leaving): what it read again and did not handle goes at once.
        await second.aclose()
        for i in range(ENTRIES, ENTRIES + 10):
            ids.append((await redis.xadd(stream, {"n": str(i)})).decode())
            good.add(ids[-1])
        await eventually(lambda: true(handled() >= good), timeout_s=30)
        await eventually(lambda: _settled(redis, stream, service), timeout_s=30)
        if step != "leave":  # (called once per consumer, at its stop)
            # A periodic step (the heartbeat, trimming) may not have failed twice yet.
            await eventually(lambda: true(faults.failed == 2), timeout_s=20)
        # The stream is listed for `streamjobs status` (a failed listing is retried).
        await eventually(lambda: _listed(redis, keys.group_streams, stream), timeout_s=20)
        await first.aclose()
    assert faults.failed == 2, f"step {step} was called {faults.calls} times"
    letters = await redis.xrange(keys.dead_letters)
    sources = [fields[b"_source_id"].decode() for _, fields in letters]
    assert sources == [ids[POISON]], "the poison entry is dead-lettered exactly once"
    assert handled() >= good
    assert (await redis.xpending(stream, service))["pending"] == 0
    assert not await redis.exists(keys.starts(stream))
    if step != "leave":  # (a failed leave leaves a member alive for its TTL)
        seconds, micros = await redis.time()
        now_ms = int(seconds) * 1000 + int(micros) // 1000
        members = await redis.zrange(keys.members(stream), 0, -1, withscores=True)
        assert [m for m, score in members if score > now_ms] == [], "a member left alive"


async def _settled(redis: Any, stream: str, group: str) -> bool:
    info = [g for g in await redis.xinfo_groups(stream) if g["name"] in (group, group.encode())]
    return bool(info) and info[0]["pending"] == 0


async def _listed(redis: Any, key: str, stream: str) -> bool:
    return bool(await redis.sismember(key, stream))
