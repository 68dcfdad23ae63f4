"""Shared groups (``GroupConsumer``) under real faults: a fleet of three
``streamjobs worker`` processes on one stream, then kill -9, SIGSTOP past the session
TTL, a slow live consumer, and entries that fail or kill their consumer. After each,
every entry is handled or dead-lettered, and nothing is left pending
(docs/shared-groups.md)."""

from __future__ import annotations

import datetime
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from redis import Redis as SyncRedis
from redis.cluster import RedisCluster as SyncRedisCluster

from streamjobs._keys import Keys
from streamjobs.testing import WorkerFleet
from tests.harness.cluster import ClusterEndpoint
from tests.harness.plugin import RedisServerFactory, WorkerFleetFactory

from ._history import duplicates, history, wait_for
from .workers import begun_key

TTL_S = 2.0
TARGET = "tests.faults.workers:GroupRecordingWorker"
ARGS = [
    "--lock-ttl", str(TTL_S),
    "--min-idle", "3",
    "--block-ms", "200",
    "--batch", "10",
    "--grace", "2",
]  # fmt: skip


@dataclass(frozen=True)
class Where:
    """The Redis the fleet runs on: its URL, a client for the test, worker options."""

    url: str
    args: tuple[str, ...]


@pytest.fixture(params=["standalone", pytest.param("cluster", marks=pytest.mark.cluster)])
def where(request: pytest.FixtureRequest, redis_server_factory: RedisServerFactory) -> Where:
    """A private standalone server, or the session's 3 + 3 cluster (workers with
    ``--cluster``; every key the test makes holds its uid and is deleted afterwards)."""
    if request.param == "cluster":
        cluster: ClusterEndpoint = request.getfixturevalue("redis_cluster")
        return Where(cluster.url, ("--cluster",))
    return Where(redis_server_factory().url, ())


@pytest.fixture
def sync(where: Where, uid: str) -> Iterator[Any]:
    if not where.args:
        r = SyncRedis.from_url(where.url)
        yield r
        r.close()
        return
    rc = SyncRedisCluster.from_url(where.url)
    try:
        yield rc
    finally:
        for key in list(rc.scan_iter(match=f"*{uid}*")):
            rc.delete(key)
        rc.close()


def produce(r: Any, stream: str, n: int, fields: dict[str, str]) -> list[str]:
    pipe = r.pipeline(transaction=False)
    for i in range(n):
        entry: dict[Any, Any] = {"n": str(i), **fields}
        pipe.xadd(stream, entry)
    return [x.decode() for x in pipe.execute()]


def pending_by(r: Any, stream: str, group: str) -> dict[str, int]:
    """Pending entries per member name (``consumer~incarnation``)."""
    summary = r.xpending(stream, group)
    return {
        c["name"].decode(): int(c["pending"]) for c in summary["consumers"] if int(c["pending"])
    }


def held_by(pending: dict[str, int], consumer: str) -> int:
    return sum(n for name, n in pending.items() if name.split("~")[0] == consumer)


def handled_ids(r: Any, service: str) -> set[str]:
    return {x.id for x in history(r, service)}


def begun(r: Any, service: str) -> list[tuple[str, str]]:
    out = []
    for raw in r.lrange(begun_key(service), 0, -1):
        consumer, entry_id = raw.decode().split("|")
        out.append((consumer, entry_id))
    return out


def start_fleet(
    factory: WorkerFleetFactory, where: Where, stream: str, sync: Any, service: str, *extra: str
) -> WorkerFleet:
    fleet = factory(where.url, TARGET, [*ARGS, *where.args, "--stream", stream, *extra])
    names = ["c0", "c1", "c2"]
    for name in names:
        fleet.start(name)
    wait_for(
        lambda: {n.split("~")[0] for n in _members(sync, service, stream)} >= set(names),
        30,
        "three consumers to join the group",
    )
    return fleet


def _members(r: Any, service: str, stream: str) -> dict[str, float]:
    key = Keys(service).members(stream)
    found: list[tuple[bytes, float]] = r.zrange(key, 0, -1, withscores=True)
    return {m.decode(): score for m, score in found}


def _dead_logged_ms(log: str) -> int | None:
    """When (unix ms, from the worker's log line) a worker first logged that its member
    was dead."""
    for line in log.splitlines():
        if " is dead (" in line:
            stamp = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
            return int(stamp.timestamp() * 1000) + 1  # the log is at ms resolution
    return None


def assert_settled(r: Any, service: str, stream: str) -> None:
    wait_for(lambda: not pending_by(r, stream, service), 10, "nothing left pending")


def test_kill_9_mid_handler(
    where: Where,
    sync: Any,
    service: str,
    uid: str,
    worker_fleet_factory: WorkerFleetFactory,
) -> None:
    stream = f"g:{uid}"
    fleet = start_fleet(worker_fleet_factory, where, stream, sync, service)
    ids = produce(sync, stream, 400, {"work_ms": "30"})
    wait_for(
        lambda: {x.consumer for x in history(sync, service)} >= {"c0", "c1", "c2"},
        30,
        "every consumer to handle entries",
    )
    held = wait_for(
        lambda: held_by(pending_by(sync, stream, service), "c0"), 10, "c0 to hold entries"
    )
    killed = time.monotonic()
    fleet.workers[0].kill()
    handled_by_victim = {x.id for x in history(sync, service) if x.consumer == "c0"}
    wait_for(
        lambda: held_by(pending_by(sync, stream, service), "c0") == 0,
        TTL_S + 10,
        "the dead consumer's entries to be claimed",
    )
    reclaim_s = time.monotonic() - killed
    wait_for(lambda: handled_ids(sync, service) >= set(ids), 60, "every entry to be handled")
    records = history(sync, service)
    dups = duplicates(records)
    print(f"\ngroup kill -9: held={held} reclaimed_after_s={reclaim_s:.2f} dups={len(dups)}")
    # Within the session TTL plus the reclaim pass (0.5 s +- 25%), plus slack for a
    # loaded machine (the figure is printed above; the design's bound is TTL + 1 s).
    assert reclaim_s < TTL_S + 2.5
    # Only what the victim handled and had not acknowledged yet runs twice.
    assert {entry_id for _, entry_id in dups} <= handled_by_victim
    assert sync.xlen(Keys(service).dead_letters) == 0
    fleet.stop_all()
    assert_settled(sync, service, stream)


def test_sigstop_past_ttl_then_sigcont(
    where: Where,
    sync: Any,
    service: str,
    uid: str,
    worker_fleet_factory: WorkerFleetFactory,
) -> None:
    stream = f"g:{uid}"
    fleet = start_fleet(worker_fleet_factory, where, stream, sync, service)
    ids = produce(sync, stream, 300, {"work_ms": "40"})
    wait_for(
        lambda: (
            held_by(pending_by(sync, stream, service), "c0")
            and any(x.consumer == "c0" for x in history(sync, service))
        ),
        30,
        "c0 to hold and handle entries",
    )
    stopped_ms = int(time.time() * 1000)
    fleet.workers[0].signal(signal.SIGSTOP)
    wait_for(
        lambda: held_by(pending_by(sync, stream, service), "c0") == 0,
        TTL_S + 10,
        "the stalled consumer's entries to be claimed",
    )
    fleet.workers[0].signal(signal.SIGCONT)
    wait_for(lambda: handled_ids(sync, service) >= set(ids), 60, "every entry to be handled")
    learned = wait_for(
        lambda: _dead_logged_ms(fleet.workers[0].output()), 10, "c0 to learn its member is dead"
    )
    records = history(sync, service)
    # Until it learns its member is dead (and joins again under a new one), at most the
    # call that was in flight when it stopped completes...
    late = [x for x in records if x.consumer == "c0" and stopped_ms <= x.t_ms <= learned]
    assert len(late) <= 1, late
    # ... and it was not acknowledged by c0: the entry went to another consumer too.
    for x in late:
        assert any(y.id == x.id and y.consumer != "c0" for y in records), x
    fleet.stop_all()
    assert_settled(sync, service, stream)


def test_slow_live_consumer_keeps_its_entry(
    where: Where,
    sync: Any,
    service: str,
    uid: str,
    worker_fleet_factory: WorkerFleetFactory,
) -> None:
    stream = f"g:{uid}"
    fleet = start_fleet(worker_fleet_factory, where, stream, sync, service)
    slow = produce(sync, stream, 1, {"work_ms": str(int(3 * TTL_S * 1000))})[0]
    rest = produce(sync, stream, 100, {"work_ms": "10"})
    wait_for(lambda: handled_ids(sync, service) >= {slow, *rest}, 30, "every entry to be handled")
    starts = [entry_id for _, entry_id in begun(sync, service) if entry_id == slow]
    assert starts == [slow], f"the slow entry was started {len(starts)} times"
    assert not duplicates(history(sync, service))
    fleet.stop_all()
    assert_settled(sync, service, stream)


def test_poison_and_crash_loop_entries_are_dead_lettered_once(
    where: Where,
    sync: Any,
    service: str,
    uid: str,
    worker_fleet_factory: WorkerFleetFactory,
) -> None:
    stream = f"g:{uid}"
    fleet = start_fleet(
        worker_fleet_factory,
        where,
        stream,
        sync,
        service,
        "--max-attempts", "2",
        "--max-retries", "1",
    )  # fmt: skip
    good = produce(sync, stream, 30, {"work_ms": "10"})
    poison = produce(sync, stream, 1, {"poison": "1"})[0]
    crash = produce(sync, stream, 1, {"crash": "1"})[0]
    good += produce(sync, stream, 30, {"work_ms": "10"})
    dlq = Keys(service).dead_letters
    wait_for(lambda: sync.xlen(dlq) >= 2, 60, "two dead letters")
    wait_for(lambda: handled_ids(sync, service) >= set(good), 60, "every good entry handled")
    letters = {
        f[b"_source_id"].decode(): {k.decode(): v.decode() for k, v in f.items()}
        for _, f in sync.xrange(dlq)
    }
    assert set(letters) == {poison, crash}
    assert sync.xlen(dlq) == 2
    assert letters[poison]["_dlq_reason"] == "handler_failed"
    assert letters[poison]["_attempts"] == "2"
    assert letters[crash]["_dlq_reason"] == "max_retries_exceeded"
    for letter in letters.values():
        assert letter["_source_stream"] == stream
        assert letter["_group"] == service
    # The crash entry killed exactly two consumers (max_retries=1: the third delivery
    # is dead-lettered unhandled).
    crash_starts = [c for c, entry_id in begun(sync, service) if entry_id == crash]
    assert len(crash_starts) == 2, crash_starts
    assert sum(1 for w in fleet.workers if not w.alive()) == 2
    fleet.stop_all()
    assert_settled(sync, service, stream)
