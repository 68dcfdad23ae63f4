"""Least privilege, against a real server: a consumer and a producer run under
exactly the ACL users docs/operations.md prints, and a missing permission is
reported at start-up, naming it."""

from __future__ import annotations

import dataclasses
import re
import shlex
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from redis.asyncio import Redis as AsyncRedis

import streamjobs.dlq
from streamjobs import (
    CancelOutcome,
    ConsumerConfig,
    DeadLetter,
    DeadLetterFilter,
    DeadLetters,
    GroupConsumer,
    GroupRetention,
    Inspector,
    Liveness,
    Message,
    PermissionDenied,
    Producer,
    RecoveryConfig,
)
from streamjobs._cli_ops import prune_consumer_names
from streamjobs._deadletter import entry_dead_letter
from streamjobs._keys import Keys
from streamjobs.testing import RedisServer
from tests.harness.plugin import RedisServerFactory

from ._helpers import Recorder, eventually

pytestmark = pytest.mark.anyio

DOC = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
PASSWORD = "acl-test-pw"
FAST = ConsumerConfig(lock_ttl_s=1, read_block_ms=50)


def documented_acl(user: str) -> list[str]:
    """The ``ACL SETUSER <user> ...`` line of docs/operations.md, as arguments."""
    for line in DOC.read_text(encoding="utf-8").splitlines():
        if line.startswith(f"ACL SETUSER {user} "):
            args = shlex.split(line)[3:]
            return [f">{PASSWORD}" if a == "><password>" else a for a in args]
    raise AssertionError(f"docs/operations.md has no ACL SETUSER {user} line")


class Refusing(Recorder):
    async def handle(self, message: Message) -> None:
        await super().handle(message)
        if message.fields.get("n") == "bad":
            raise DeadLetter("bad entry")


@pytest.fixture
async def server(redis_server_factory: RedisServerFactory) -> RedisServer:
    return redis_server_factory(extra_args=["--notify-keyspace-events", "Kx"])


@pytest.fixture
async def admin(server: RedisServer) -> AsyncIterator[AsyncRedis]:
    client = AsyncRedis(port=server.port)
    yield client
    await client.aclose()


@pytest.fixture
async def as_user(server: RedisServer, admin: AsyncRedis) -> AsyncIterator[Callable[..., Any]]:
    """``as_user(name, acl_args)``: create the user, return a client logged in as it."""
    clients: list[AsyncRedis] = []

    # As docs/operations.md says: on servers that have CLIENT SETINFO (Redis 7.2+,
    # Valkey), which redis-py sends on connect, allow it too.
    about = await admin.info("server")
    version = tuple(int(x) for x in str(about["redis_version"]).split(".")[:2])
    extra = ["+client|setinfo"] if "valkey_version" in about or version >= (7, 2) else []

    async def make(name: str, acl: list[str]) -> AsyncRedis:
        await admin.execute_command("ACL", "SETUSER", name, "reset", *acl, *extra)  # type: ignore[no-untyped-call]
        client = AsyncRedis(port=server.port, username=name, password=PASSWORD)
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.aclose()


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


async def denials(admin: AsyncRedis) -> list[tuple[str, str]]:
    out = []
    for entry in await admin.execute_command("ACL", "LOG"):  # type: ignore[no-untyped-call]
        # A flat list on Redis 7.0; redis-py parses Valkey 8's reply into a dict.
        d = entry if isinstance(entry, dict) else dict(zip(entry[::2], entry[1::2], strict=True))
        d = {k.decode() if isinstance(k, bytes) else k: v for k, v in d.items()}
        out.append((_text(d["reason"]), _text(d["object"])))
    return out


@pytest.mark.parametrize(
    ("user", "configure", "liveness"),
    [
        ("streamjobs-consumer", True, Liveness.LOCK),
        ("streamjobs-consumer-handsoff", False, Liveness.LOCK),
        ("streamjobs-consumer", True, Liveness.SESSION),
    ],
)
async def test_the_documented_users_run_everything_and_are_refused_nothing(
    admin: AsyncRedis,
    as_user: Callable[..., Any],
    service: str,
    user: str,
    configure: bool,
    liveness: Liveness,
) -> None:
    consumer_client = await as_user(user, documented_acl(user))
    producer_client = await as_user("streamjobs-producer", documented_acl("streamjobs-producer"))
    keys = Keys(service)
    producer = Producer(producer_client, service=service)
    streams = [f"data:{service}:{i}" for i in range(3)]
    for s in streams:
        await producer.add_stream(s, {"k": 1})
        await producer.append(s, {"n": "0"})
        await producer.append(s, {"n": "bad"})
        await producer.close_stream(s)
    # One assignment taken by a consumer that died at once: recovery must re-queue it.
    crashed = f"data:{service}:crashed"
    await producer.add_stream(crashed)
    await producer.append(crashed, {"n": "0"})
    await producer.close_stream(crashed)
    await admin.xgroup_create(keys.assignments, service, id="0", mkstream=True)
    await admin.xreadgroup(service, "dead", {keys.assignments: ">"}, count=1)
    recovery = RecoveryConfig(
        min_idle_s=1.5,
        interval_s=0.5,
        lease_check_interval_s=0.2,
        configure_keyspace_events=configure,
    )
    config = dataclasses.replace(FAST, liveness=liveness)
    consumer = Refusing(consumer_client, service=service, config=config, recovery=recovery)
    # One held by the consumer and then cancelled by the producer.
    held = f"data:{service}:held"
    await producer.add_stream(held)
    await producer.append(held, {"n": "0"})
    async with consumer:

        async def all_ended() -> bool:
            return sorted(consumer.ended) == sorted([*streams, crashed])

        await eventually(all_ended, timeout_s=30)

        async def holding() -> bool:
            return held in consumer.owned_streams

        await eventually(holding, timeout_s=30)
        assert await producer.cancel_stream(held) is CancelOutcome.SIGNALLED

        async def released() -> bool:
            return not await admin.exists(keys.lock(held))

        await eventually(released, timeout_s=30)
    # A job cancelled before any consumer read it: removed, its entries skipped.
    queued = f"data:{service}:queued"
    await producer.add_stream(queued)
    await producer.append(queued, {"n": "0"})
    assert await producer.cancel_stream(queued) is CancelOutcome.REMOVED
    # One whose owner read its end marker and still holds the lock: the cancel is moot
    # (the script reads the group's position).
    ending = f"data:{service}:ending"
    await admin.xadd(ending, {"_eos": "1"})
    await admin.xgroup_create(ending, service, "$")
    await admin.set(keys.lock(ending), "owner:1", px=60_000)
    assert await producer.cancel_stream(ending) is CancelOutcome.SIGNALLED
    assert not await admin.exists(keys.cancel(ending))
    await admin.delete(keys.lock(ending))
    assert await denials(admin) == []
    assert await admin.xlen(keys.dead_letters) == len(streams)
    assert (await admin.xpending(keys.assignments, service))["pending"] == 0
    assert await admin.xlen(keys.assignments) == 0
    for s in [*streams, crashed, held]:
        assert await admin.exists(keys.lock(s)) == 0
    await share(consumer_client, service)
    operator = await as_user("streamjobs-operator", documented_acl("streamjobs-operator"))
    await operate(operator, service)
    assert await denials(admin) == []


class Sharing(GroupConsumer):
    """Dead-letters ``n=bad``; ``n=crash`` entries are taken from a dead member."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.handled: list[str] = []

    async def handle(self, message: Message) -> None:
        if message.fields["n"] == "bad":
            raise DeadLetter("bad entry")
        self.handled.append(message.fields["n"])


async def share(client: Any, service: str) -> None:
    """A GroupConsumer under the consumer's ACL: reads, acks, takes the entries of a
    dead member (one whose session is over), restarts one, dead-letters one, trims."""
    stream = f"data:{service}:shared"
    keys = Keys(service)
    await client.xgroup_create(stream, service, id="0", mkstream=True)
    for n in ("0", "1"):
        await client.xadd(stream, {"n": n})
    await client.xreadgroup(service, "ghost~0", {stream: ">"}, count=1)
    await client.zadd(keys.members(stream), {"ghost~0": 1})  # a dead member
    await client.xadd(stream, {"n": "bad"})
    consumer = Sharing(
        client,
        service=service,
        streams=[stream],
        config=FAST,
        retention=GroupRetention(interval_s=0.1),
    )
    async with consumer:

        async def done() -> bool:
            return sorted(consumer.handled) == ["0", "1"]

        await eventually(done, timeout_s=30)
    assert (await client.xpending(stream, service))["pending"] == 0


async def operate(client: Any, service: str) -> None:
    """What an operator does: status, the DLQ, a replay, a purge, a prune."""
    overview = await Inspector(client, service=service).overview()
    assert overview.dlq.length == 4
    assert [g.stream for g in overview.groups] == [f"data:{service}:shared"]
    letters = DeadLetters(client, service=service)
    first, second, *_ = await letters.list()
    report = await letters.replay([first.id])
    assert len(report.replayed) == 1, report
    assert await letters.purge([second.id]) == [second.id]
    await prune_consumer_names(client, Keys(service), dry_run=False)


@pytest.mark.parametrize(
    ("missing", "named"),
    [
        ("+script|load", "script|load"),
        ("+xgroup|create", "xgroup|create"),
        ("&__keyspace@0__:streamjobs:lock:*", "PSUBSCRIBE"),
    ],
)
async def test_a_missing_permission_stops_the_start_naming_it(
    as_user: Callable[..., Any], service: str, missing: str, named: str
) -> None:
    acl = [a for a in documented_acl("streamjobs-consumer") if a != missing]
    client = await as_user("too-little", acl)
    consumer = Recorder(client, service=service, config=FAST)
    with anyio.fail_after(20), pytest.raises(PermissionDenied) as caught:
        await consumer.run()
    assert named in str(caught.value)
    assert "docs/operations.md#least-privilege-acl" in str(caught.value)
    assert re.search(r"lacks a permission it needs", str(caught.value))


async def test_a_data_stream_outside_the_users_keys_is_logged_not_silent(
    as_user: Callable[..., Any],
    admin: AsyncRedis,
    service: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = await as_user("streamjobs-consumer", documented_acl("streamjobs-consumer"))
    outside = f"other:{service}"  # not matched by ~data:*
    await Producer(admin, service=service).add_stream(outside)
    consumer = Recorder(client, service=service, config=FAST)
    async with consumer:

        async def given_up() -> bool:
            return int(await admin.xlen(Keys(service).dead_letters)) == 1

        await eventually(given_up)
    messages = [r.getMessage() for r in caplog.records]
    assert any("acquire" in m and "no permissions" in m.lower() for m in messages)
    assert any("taking the stream's lock kept failing" in m for m in messages)
    assert consumer.started == []


async def test_the_operator_replays_a_finished_jobs_dead_entry(
    as_user: Callable[..., Any], admin: AsyncRedis, service: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """A replay into a stream whose job ended: it skips what the ended job left, queues
    a run of it, places the entry; one that gives up waiting removes its run again."""
    keys = Keys(service)
    producer = Producer(admin, service=service)
    streams, bad_ids = {}, {}
    for name in ("done", "stuck"):
        stream = streams[name] = f"data:{service}:{name}"
        job = await producer.add_stream(stream, {"job": name})
        bad = bad_ids[name] = await producer.append(stream, {"n": "bad"})
        await producer.close_stream(stream)
        # As a consumer leaves it: all read and acked, the job ended, its dead letter.
        await admin.xgroup_create(stream, service, "$")
        await admin.xdel(keys.assignments, job)
        await admin.hdel(keys.active, stream)
        if name == "done":
            await admin.set(keys.ended(stream), f"n {job}", px=60_000)
            await producer.append(stream, {"n": "late"})  # the ended job's: skipped
        letter = entry_dead_letter(
            {"n": "bad"}, stream=stream, entry_id=bad, retry_count=0, attempts=1,
            owner="c", error="E: x", info={"job": name}, job=job,
        )  # fmt: skip
        await admin.xadd(keys.dead_letters, dict(letter))
    # "stuck": an owner read its end marker and died before acking it (its assignment
    # was dead-lettered since): the replay waits, gives up, and leaves no run behind.
    await admin.xgroup_setid(streams["stuck"], service, "0")
    await admin.xreadgroup(service, "ghost", {streams["stuck"]: ">"})
    operator = await as_user("streamjobs-operator", documented_acl("streamjobs-operator"))
    letters = DeadLetters(operator, service=service)
    monkeypatch.setattr(streamjobs.dlq, "BUSY_WAIT_S", 0.3)
    report = await letters.replay(DeadLetterFilter())
    assert [r.target for r in report.replayed] == [streams["done"]], report
    [(_, why)] = report.skipped
    assert "ending" in why
    assert await denials(admin) == []
    runs: Any = await admin.xrange(keys.assignments)
    [(run_id, run)] = runs
    assert run[b"stream"] == streams["done"].encode()
    assert b"_job" in run
    assert await admin.hget(keys.active, streams["done"]) == run_id
    [group] = await admin.xinfo_groups(streams["done"])
    unread = await admin.xrange(streams["done"], f"({group['last-delivered-id'].decode()}")
    assert [f.get(b"n", f.get(b"_eos")) for _, f in unread] == [b"bad", b"1"], "not 'late'"
    assert unread[0][1][b"_replayed_from"] == bad_ids["done"].encode()
