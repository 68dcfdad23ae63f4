"""``GroupConsumer`` against real Redis, standalone and on the cluster: entries shared by
the members of a group, each handled once; retries, dead letters and their replay;
bytes mode and plain handlers; a graceful stop that hands unhandled entries on at once;
the fence on acknowledgements; entries of other clients and trimmed entries
(docs/shared-groups.md)."""

from __future__ import annotations

import io
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.to_thread
import pytest
from redis.asyncio import Redis as AsyncRedis
from redis.exceptions import BusyLoadingError
from redis.exceptions import ConnectionError as RedisConnectionError

from streamjobs import (
    ClusterMode,
    ConfigurationError,
    ConsumerConfig,
    DeadLetter,
    DeadLetters,
    GroupConsumer,
    GroupRetention,
    Inspector,
    Message,
    NullRecorder,
    RecoveryConfig,
    Retry,
)
from streamjobs._cli_ops import print_overview
from streamjobs._keys import Keys
from streamjobs._redis import Gateway
from streamjobs.group import group_runtime_of
from tests.harness.plugin import RedisServerFactory, cluster_mode_for

from ._helpers import eventually

pytestmark = pytest.mark.anyio

FAST = ConsumerConfig(lock_ttl_s=1.0, read_block_ms=100, read_batch_size=10)


class Recording(GroupConsumer):
    """Records (consumer, stream, id, fields) of every handled entry; ``n=bad`` is
    dead-lettered until ``fixed``, ``n=retry`` asks once for a retry, ``slow_s`` sleeps."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seen: list[tuple[str, str, str, dict[str, str]]] = []
        self.messages: list[Message] = []
        self.fixed = False
        self.retried: set[str] = set()

    async def handle(self, message: Message) -> None:
        n = message.fields.get("n")
        if n == "bad" and not self.fixed:
            raise DeadLetter("bad for now")
        if n == "retry" and message.id not in self.retried:
            self.retried.add(message.id)
            raise Retry(0.01)
        if "slow_s" in message.fields:
            await anyio.sleep(float(message.fields["slow_s"]))
        self.seen.append((self.consumer_name, message.stream, message.id, dict(message.fields)))
        self.messages.append(message)


@asynccontextmanager
async def running(*consumers: GroupConsumer[Any]) -> AsyncIterator[None]:
    async with anyio.create_task_group() as tg:
        for consumer in consumers:
            await tg.start(consumer.run)
        try:
            yield
        finally:
            for consumer in consumers:
                await consumer.aclose()


def members_key(service: str, stream: str) -> str:
    return Keys(service).members(stream)


async def pending(redis: Any, stream: str, group: str) -> int:
    return int((await redis.xpending(stream, group))["pending"])


def make(
    redis: Any,
    service: str,
    streams: Sequence[str],
    name: str,
    cls: type[GroupConsumer[Any]] = Recording,
    **kwargs: Any,
) -> Any:
    kwargs.setdefault("config", FAST)
    return cls(
        redis,
        service=service,
        streams=streams,
        consumer_name=name,
        cluster_mode=cluster_mode_for(redis),
        **kwargs,
    )


async def test_entries_are_shared_and_each_handled_once(redis: Any, service: str, uid: str) -> None:
    streams = [f"g:{uid}:a", f"g:{uid}:b"]
    consumers = [make(redis, service, streams, f"c{i}") for i in range(3)]
    async with running(*consumers):
        ids = {s: [await redis.xadd(s, {"n": str(i)}) for i in range(100)] for s in streams}
        await eventually(lambda: _async(_count(consumers) >= 200))
    seen = [row for c in consumers for row in c.seen]
    assert sorted((s, i) for _, s, i, _ in seen) == sorted(
        (s, i.decode()) for s in streams for i in ids[s]
    )
    assert len({c for c, _, _, _ in seen}) >= 2, "the work was not shared"
    for c in consumers:  # in the order read, within one consumer and stream
        for s in streams:
            mine = [_order(i) for _, stream, i, _ in c.seen if stream == s]
            assert mine == sorted(mine)
    for s in streams:
        assert await pending(redis, s, service) == 0
        scores = [
            score
            for _, score in await redis.zrange(members_key(service, s), 0, -1, withscores=True)
        ]
        assert len(scores) == 3
        assert all(score < 0 for score in scores), "not all stopped"
        groups = await redis.xinfo_groups(s)
        assert groups[0]["consumers"] == 0, "a stopped member with nothing pending stays"


def _count(consumers: Sequence[Recording]) -> int:
    return sum(len(c.seen) for c in consumers)


def _order(entry_id: str) -> tuple[int, int]:
    ms, seq = entry_id.split("-")
    return int(ms), int(seq)


async def test_retry_dead_letter_and_replay(redis: Any, service: str, uid: str) -> None:
    stream = f"g:{uid}"
    consumer = make(redis, service, [stream], "c0")
    async with running(consumer):
        good = await redis.xadd(stream, {"n": "retry"})
        bad = (await redis.xadd(stream, {"n": "bad", "payload": "x"})).decode()
        dlq = DeadLetters(redis, service=service)
        await eventually(lambda: _has_letters(dlq, 1))
        await eventually(lambda: _settled(redis, stream, service))
        assert [m.id for m in consumer.messages] == [good.decode()]
        assert consumer.messages[0].attempt == 2
        (letter,) = await dlq.list()
        assert (letter.source_stream, letter.source_id, letter.group) == (stream, bad, service)
        assert letter.rejected == "bad for now"
        assert dict(letter.fields) == {"n": "bad", "payload": "x"}
        consumer.fixed = True
        report = await dlq.replay([letter.id])
        assert [r.target for r in report.replayed] == [stream]
        await eventually(lambda: _async(len(consumer.messages) == 2))
        again = consumer.messages[1]
        assert again.replayed_from == bad
        assert again.fields["payload"] == "x"
        assert await dlq.length() == 0
        # A repeat of the same replay appends nothing.
        assert (await dlq.replay([letter.id])).replayed == []
        stats = consumer.statistics()
        assert (stats.running, stats.healthy, stats.ready) == (True, True, True)
    assert await redis.xlen(stream) == 3
    stats = consumer.statistics()
    assert stats.entries == {"retried": 1, "dead_lettered": 1, "ok": 1}
    assert stats.dead_letters == {"rejected": 1}
    assert stats.handler_failures == 2
    assert not stats.running


async def _has_letters(dlq: DeadLetters, n: int) -> bool:
    return await dlq.length() >= n


async def _settled(redis: Any, stream: str, group: str) -> bool:
    return await pending(redis, stream, group) == 0


async def _async(value: bool) -> bool:
    return value


class Raw(GroupConsumer[bytes]):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seen: list[Message[bytes]] = []

    def handle(self, message: Message[bytes]) -> None:  # a plain def: a worker thread
        self.seen.append(message)


async def test_bytes_mode_with_a_plain_handler(redis: Any, service: str, uid: str) -> None:
    stream = f"g:{uid}"
    blob = bytes(range(256))
    consumer = make(redis, service, [stream], "c0", cls=Raw)
    async with running(consumer):
        await redis.xadd(stream, {b"blob": blob})
        await eventually(lambda: _async(len(consumer.seen) == 1))
    assert consumer.seen[0].fields == {b"blob": blob}


async def test_start_id_dollar_reads_only_new_entries(redis: Any, service: str, uid: str) -> None:
    stream = f"g:{uid}"
    await redis.xadd(stream, {"n": "old"})
    consumer = make(redis, service, [stream], "c0", start_id="$")
    async with running(consumer):
        await redis.xadd(stream, {"n": "new"})
        await eventually(lambda: _async(len(consumer.seen) == 1))
        await anyio.sleep(0.3)  # an old entry would have come first
    assert [f["n"] for _, _, _, f in consumer.seen] == ["new"]


async def test_graceful_stop_hands_unhandled_entries_on_at_once(
    redis: Any, service: str, uid: str
) -> None:
    stream = f"g:{uid}"
    slow_config = ConsumerConfig(
        lock_ttl_s=10.0, read_block_ms=100, read_batch_size=10, shutdown_grace_s=0.5
    )
    for i in range(10):  # all there before the first read, which takes the 10
        await redis.xadd(stream, {"n": str(i), "slow_s": "0.2"})
    first = make(redis, service, [stream], "c0", config=slow_config)
    async with running(first):
        await eventually(lambda: _async(len(first.seen) >= 1))
    left = await pending(redis, stream, service)
    assert left > 0, "the first consumer handled everything before it stopped"
    second = make(redis, service, [stream], "c1", config=slow_config)
    started = time.monotonic()
    async with running(second):
        await eventually(lambda: _settled(redis, stream, service), timeout_s=10)
    # Long before the 10 s session TTL: a stopped member's entries go at once.
    assert time.monotonic() - started < 5
    handled = {i for _, _, i, _ in first.seen + second.seen}
    assert len(handled) == 10


async def test_a_dead_member_acknowledges_nothing_and_joins_again(
    redis: Any, service: str, uid: str
) -> None:
    stream = f"g:{uid}"
    consumer = make(redis, service, [stream], "c0")
    async with running(consumer):
        await redis.xadd(stream, {"n": "0"})
        await eventually(lambda: _async(len(consumer.seen) == 1))
        lane = group_runtime_of(consumer).lanes[0]
        old = lane.member
        entry = (await redis.xadd(stream, {"n": "held", "slow_s": "0.5"})).decode()
        await eventually(lambda: _pending_under(redis, stream, service, old))
        # The session ends on the server while the handler runs.
        await redis.zadd(members_key(service, stream), {old: 1})
        gw = group_runtime_of(consumer).gateway
        assert not await gw.groups.ack(stream, old, [entry]), "a dead member acks nothing"
        await eventually(lambda: _async(lane.member != old and not lane.dead))
        # The entry the dead member held is reclaimed and handled under the new one.
        await eventually(lambda: _settled(redis, stream, service))
        assert [i for _, _, i, _ in consumer.seen].count(entry) >= 1
        await redis.xadd(stream, {"n": "after"})
        await eventually(lambda: _async(consumer.seen[-1][3]["n"] == "after"))
    stats = consumer.statistics()
    assert stats.entries_reclaimed >= 1
    assert stats.stream_events.get("lost", 0) >= 1
    assert stats.scan_passes > 0


async def test_a_reply_about_an_earlier_member_does_not_end_the_current_one(
    redis: Any, service: str, uid: str
) -> None:
    """A heartbeat or reclaim pass sent for a member that died, answered after the
    lane joined again: "dead" is about the old member, not the new one (the soak
    found a fresh member thrown away so, left alive on the server for a TTL)."""
    stream = f"g:{uid}"
    consumer = make(redis, service, [stream], "c0")
    async with running(consumer):
        lane = group_runtime_of(consumer).lanes[0]
        old = lane.member
        lane.lose("made dead by the test")
        await eventually(lambda: _async(lane.member != old and not lane.dead))
        current = lane.member
        lane.lose("a stale reply", old)
        assert not lane.dead
        assert lane.member == current
        await redis.xadd(stream, {"n": "0"})
        await eventually(lambda: _async(len(consumer.seen) == 1))


async def _pending_under(redis: Any, stream: str, group: str, member: str) -> bool:
    found = await redis.xpending_range(stream, group, "-", "+", 10, consumername=member)
    return bool(found)


async def test_other_clients_entries_are_taken_after_min_idle(
    redis: Any, service: str, uid: str
) -> None:
    stream = f"g:{uid}"
    await redis.xgroup_create(stream, service, id="0", mkstream=True)
    kept = (await redis.xadd(stream, {"n": "kept"})).decode()
    trimmed = (await redis.xadd(stream, {"n": "trimmed"})).decode()
    await redis.xreadgroup(service, "outsider", {stream: ">"}, count=10)
    await redis.xdel(stream, trimmed)  # pending, but gone from the stream
    recovery = RecoveryConfig(min_idle_s=1.5)
    consumer = make(redis, service, [stream], "c0", recovery=recovery)
    started = time.monotonic()
    async with running(consumer):
        await eventually(lambda: _settled(redis, stream, service), timeout_s=10)
    assert time.monotonic() - started >= 1.0, "taken before min_idle_s"
    assert [i for _, _, i, _ in consumer.seen] == [kept]


async def test_bad_settings_name_their_field(redis: Any, service: str) -> None:
    mode = cluster_mode_for(redis)
    with pytest.raises(ConfigurationError, match="streams"):
        Recording(redis, service=service, cluster_mode=mode)
    with pytest.raises(ConfigurationError, match="streams"):
        Recording(redis, service=service, streams="orders", cluster_mode=mode)
    with pytest.raises(ConfigurationError, match="start_id"):
        Recording(redis, service=service, streams=["a"], start_id="1-0", cluster_mode=mode)
    with pytest.raises(ConfigurationError, match="streams"):

        class OneName(GroupConsumer):
            streams = "orders"

            async def handle(self, message: Message) -> None: ...


async def test_cluster_mode_must_match_the_client(redis: Any, service: str) -> None:
    wrong = ClusterMode.NONE if cluster_mode_for(redis) is ClusterMode.OSS else ClusterMode.OSS
    with pytest.raises(ConfigurationError, match="cluster_mode"):
        Recording(redis, service=service, streams=["a"], cluster_mode=wrong)


async def test_status_shows_each_group_and_its_members(redis: Any, service: str, uid: str) -> None:
    stream = f"g:{uid}"
    await redis.xgroup_create(stream, service, id="0", mkstream=True)
    await redis.xadd(stream, {"n": "0"})
    await redis.xreadgroup(service, "outsider", {stream: ">"}, count=1)  # no session
    stays, leaves = make(redis, service, [stream], "c0"), make(redis, service, [stream], "c1")
    async with running(stays):
        async with running(leaves):
            await redis.xadd(stream, {"n": "1"})
            await eventually(lambda: _async(len(stays.seen) + len(leaves.seen) == 1))
        view = await Inspector(redis, service=service).overview()
        text = io.StringIO()
        print_overview(view, text)
    (group,) = view.groups
    assert (group.stream, group.exists, group.pending) == (stream, True, 1)
    assert group.oldest_pending_age_s >= 0
    states = {m.consumer: m.state for m in group.members}
    assert states == {"c0": "alive", "c1": "stopped", "outsider": "unknown"}
    assert view.to_json()["groups"][0]["members"][0]["state"] in ("alive", "stopped", "unknown")
    assert "shared groups (1 stream)" in text.getvalue()
    assert "owned streams" not in text.getvalue()  # no StreamConsumer ran
    assert "outsider" in text.getvalue()


class Trims(NullRecorder):
    def __init__(self) -> None:
        self.acknowledged = 0
        self.dropped = 0

    def stream_trimmed(self, service: str, acknowledged: int, dropped: int) -> None:
        self.acknowledged += acknowledged
        self.dropped += dropped


async def _lagging_group(redis: Any, stream: str, group: str) -> list[str]:
    """600 entries; ``group`` (another service's) has read 300 and acknowledged 250."""
    await redis.xgroup_create(stream, group, id="0", mkstream=True)
    async with redis.pipeline(transaction=False) as pipe:
        for i in range(600):
            pipe.xadd(stream, {"n": str(i)})
        ids = [i.decode() for i in await pipe.execute()]
    await redis.xreadgroup(group, "x", {stream: ">"}, count=300)
    await redis.xack(stream, group, *ids[:250])
    return ids


async def _length_below(redis: Any, stream: str, n: int) -> bool:
    return int(await redis.xlen(stream)) < n


async def test_retention_trims_only_what_every_group_acknowledged(
    redis: Any, service: str, uid: str
) -> None:
    stream = f"g:{uid}"
    ids = await _lagging_group(redis, stream, f"{service}-other")
    trims = Trims()
    retention = GroupRetention(interval_s=0.1)
    consumer = make(redis, service, [stream], "c0", retention=retention, metrics=trims)
    async with running(consumer):
        await eventually(lambda: _async(len(consumer.seen) == 600))
        await eventually(lambda: _length_below(redis, stream, 600))
        await anyio.sleep(0.5)  # more passes: none may go further
    left = [i.decode() for i, _ in await redis.xrange(stream)]
    assert set(ids[250:]) <= set(left), "an entry the other group has not acknowledged went"
    assert trims.acknowledged == 600 - len(left)
    assert trims.dropped == 0


async def test_a_retention_cap_counts_what_it_drops(redis: Any, service: str, uid: str) -> None:
    stream = f"g:{uid}"
    await _lagging_group(redis, stream, f"{service}-other")
    trims = Trims()
    retention = GroupRetention(trim_acknowledged=False, max_len=100, interval_s=0.1)
    consumer = make(redis, service, [stream], "c0", retention=retention, metrics=trims)
    async with running(consumer):
        await eventually(lambda: _length_below(redis, stream, 300))
    left = int(await redis.xlen(stream))
    assert left >= 100
    assert trims.acknowledged == 0
    assert trims.dropped == 600 - left


async def test_one_consumer_of_a_service_trims_a_stream_per_interval(
    redis: Any, service: str, uid: str
) -> None:
    """The first trim pass of an interval leaves a pace key in the stream's slot; the
    other consumers' passes find it and skip (one pass per interval, not one per
    consumer) until it expires."""
    stream = f"g:{uid}"
    for i in range(600):
        await redis.xadd(stream, {"n": str(i)})
    await redis.xgroup_create(stream, service, id="$")  # every entry acknowledged
    gw = group_runtime_of(make(redis, service, [stream], "c0")).gateway
    assert isinstance(gw, Gateway)
    await gw.assignments.load_scripts()
    keys, args = [stream, gw.keys.trimmed(stream)], ["1", 0, 0, 10_000, 60_000]

    first = [int(x) for x in await gw.scripts.group_trim(keys=keys, args=args)]
    assert first[0] > 0
    assert first[1:] == [0, 1]
    assert 0 < int(await redis.pttl(keys[1])) <= 60_000
    for i in range(300):
        await redis.xadd(stream, {"n": f"more {i}"})
    await redis.xgroup_setid(stream, service, "$")
    skipped = [int(x) for x in await gw.scripts.group_trim(keys=keys, args=args)]
    assert skipped == [0, 0, 0]
    await redis.delete(keys[1])  # the interval is over
    again = [int(x) for x in await gw.scripts.group_trim(keys=keys, args=args)]
    assert again[0] > 0
    assert again[2] == 1


async def test_bad_retention_names_its_field() -> None:
    with pytest.raises(ConfigurationError, match="max_len"):
        GroupRetention(max_len=0)
    with pytest.raises(ConfigurationError, match="interval_s"):
        GroupRetention(interval_s=-1)


async def test_two_services_on_one_stream_each_get_every_entry(
    redis: Any, service: str, uid: str
) -> None:
    stream = f"g:{uid}"
    other = f"{service}-other"
    ours, theirs = make(redis, service, [stream], "c0"), make(redis, other, [stream], "c0")
    async with running(ours, theirs):
        ids = {(await redis.xadd(stream, {"n": str(i)})).decode() for i in range(30)}
        await eventually(lambda: _async(len(ours.seen) == len(theirs.seen) == 30))
    assert {i for _, _, i, _ in ours.seen} == ids == {i for _, _, i, _ in theirs.seen}
    for group in (service, other):
        assert await pending(redis, stream, group) == 0


async def test_a_second_run_reads_on(redis: Any, service: str, uid: str) -> None:
    stream = f"g:{uid}"
    consumer = make(redis, service, [stream], "c0")
    for round_ in range(2):
        async with running(consumer):
            await redis.xadd(stream, {"n": str(round_)})
            await eventually(lambda: _async(len(consumer.seen) == round_ + 1))  # noqa: B023
    assert [f["n"] for _, _, _, f in consumer.seen] == ["0", "1"]
    assert await pending(redis, stream, service) == 0


async def test_a_stream_key_of_another_type_does_not_end_run(
    redis: Any, service: str, uid: str
) -> None:
    good, bad = f"g:{uid}:good", f"g:{uid}:bad"
    await redis.set(bad, "not a stream")
    consumer = make(redis, service, [good, bad], "c0")
    async with running(consumer):
        await redis.xadd(good, {"n": "0"})
        await eventually(lambda: _async(len(consumer.seen) == 1))
        await eventually(lambda: _async(consumer.statistics().loop_errors.get("group", 0) > 0))
    assert await redis.get(bad) == b"not a stream"


async def test_a_redis_restart_loses_nothing(
    redis_server_factory: RedisServerFactory, service: str, uid: str
) -> None:
    server = redis_server_factory(appendonly=True)
    client = AsyncRedis.from_url(server.url)
    stream = f"g:{uid}"
    consumer = make(client, service, [stream], "c0")
    try:
        async with running(consumer):
            ids = {(await client.xadd(stream, {"n": str(i)})).decode() for i in range(20)}
            await eventually(lambda: _async(len(consumer.seen) == 20))
            await anyio.to_thread.run_sync(server.restart)
            ids |= {(await _xadd_retrying(client, stream, i)) for i in range(20, 40)}
            await eventually(lambda: _async({i for _, _, i, _ in consumer.seen} >= ids))
        assert await pending(client, stream, service) == 0
    finally:
        await client.aclose()


async def _xadd_retrying(client: Any, stream: str, i: int) -> str:
    """XADD once the restarted server accepts writes again."""
    with anyio.fail_after(20):
        while True:
            try:
                return (await client.xadd(stream, {"n": str(i)})).decode()  # type: ignore[no-any-return]
            except (RedisConnectionError, BusyLoadingError):
                await anyio.sleep(0.1)
