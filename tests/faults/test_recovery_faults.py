"""Recovery under real faults: kill -9, SIGSTOP, poison streams, restarts, expiry lag."""

from __future__ import annotations

import signal
import time

import pytest
from redis import Redis as SyncRedis

from streamjobs._keys import Keys
from streamjobs.testing import RedisServer
from tests.harness.plugin import RedisServerFactory, WorkerFleetFactory

from ._history import (
    all_done,
    assert_clean,
    duplicates,
    history,
    owners,
    produce,
    wait_for,
)

LOCK_TTL_S = 2.0
# Lease sweep period (1 s) + notification jitter + intake block + one handler call.
MARGIN_S = 2.5
ARGS = [
    "--lock-ttl", str(LOCK_TTL_S),
    "--scan-interval", "2",
    "--min-idle", "3",
    "--block-ms", "100",
    "--concurrency", "40",
    "--batch", "10",
    "--grace", "2",
]  # fmt: skip
TARGET = "tests.faults.workers:RecordingWorker"


def recovery_time(records: list, victim: str, victim_streams: set[str], kill_ms: int) -> float:  # type: ignore[type-arg]
    after = [
        x.t_ms
        for x in records
        if x.stream in victim_streams and x.consumer != victim and x.t_ms >= kill_ms
    ]
    assert after, "no stream of the victim was recovered"
    return float(min(after) - kill_ms) / 1000


@pytest.mark.parametrize("liveness", ["lock", "session"])
def test_kill_9_mid_handler(
    liveness: str,
    server: RedisServer,
    sync: SyncRedis,
    service: str,
    uid: str,
    worker_fleet_factory: WorkerFleetFactory,
) -> None:
    streams = [f"d:{uid}:{i}" for i in range(30)]
    # Each consumer takes at most 15 of the 30 streams: c0 starts first and fills up,
    # the other two share the rest and keep free slots for c0's streams.
    args = [*ARGS, "--concurrency", "15", "--liveness", liveness]
    fleet = worker_fleet_factory(server.url, TARGET, args)
    fleet.start("c0")
    # 50 entries of 60 ms: each stream takes 3 s, long enough for c1 and c2 to start
    # (a second or so each) while c0 still owns its streams.
    total = produce(sync, service, streams, 50, {"work_ms": 60})
    victim = "c0"
    owned = wait_for(
        lambda: (
            {s for s, o in owners(sync, service, streams).items() if o == victim}
            if any(x.consumer == victim for x in history(sync, service))
            else set()
        ),
        15,
        "the victim to own streams and handle entries",
    )
    fleet.start("c1")
    fleet.start("c2")
    wait_for(
        lambda: {x.consumer for x in history(sync, service)} - {"c0"},
        # Two interpreters start and import; on a loaded 2-core machine that took
        # longer than 15 s (the victim's streams take 3 s of work each, so they
        # still have work to hand over).
        30,
        "another consumer to start working",
    )
    owned = {s for s, o in owners(sync, service, streams).items() if o == victim}
    assert owned, "the victim finished its streams before it could be killed"
    kill_ms = int(time.time() * 1000)
    fleet.workers[0].kill()
    handled_by_victim = {(x.stream, x.id) for x in history(sync, service) if x.consumer == victim}
    wait_for(lambda: all_done(sync, service, total), 60, "every entry to be handled")
    records = history(sync, service)
    assert {(x.stream, x.id) for x in records} >= {
        (s, i) for s in streams for i in {x.id for x in records if x.stream == s}
    }
    dups = duplicates(records)
    # Only entries the victim had handled but not yet acked (one batch per stream).
    assert set(dups) <= handled_by_victim
    assert sum(dups.values()) <= len(owned) * 10
    rt = recovery_time(records, victim, owned, kill_ms)
    print(f"\nkill -9: owned={len(owned)} recovery_s={rt:.2f} duplicates={sum(dups.values())}")
    assert rt < LOCK_TTL_S + MARGIN_S
    assert len({(x.stream, x.id) for x in records}) == total
    assert sync.xlen(Keys(service).dead_letters) == 0
    assert_clean(sync, service, streams)


@pytest.mark.parametrize("liveness", ["lock", "session"])
def test_sigstop_past_ttl_then_sigcont(
    liveness: str,
    server: RedisServer,
    sync: SyncRedis,
    service: str,
    uid: str,
    worker_fleet_factory: WorkerFleetFactory,
) -> None:
    streams = [f"d:{uid}:{i}" for i in range(8)]
    fleet = worker_fleet_factory(server.url, TARGET, [*ARGS, "--liveness", liveness])
    stopped = fleet.start("c0")
    total = produce(sync, service, streams, 30, {"work_ms": 50})
    owned = wait_for(
        lambda: (
            {s for s, o in owners(sync, service, streams).items() if o == "c0"}
            if any(x.consumer == "c0" for x in history(sync, service))
            else set()
        ),
        15,
        "c0 to own streams",
    )
    stop_ms = int(time.time() * 1000)
    stopped.signal(signal.SIGSTOP)
    fleet.start("c1")
    # Every stream c0 owned is taken over by c1.
    wait_for(
        lambda: owned <= {x.stream for x in history(sync, service) if x.consumer == "c1"},
        LOCK_TTL_S + 15,
        "c1 to take over c0's streams",
    )
    cont_ms = int(time.time() * 1000)
    stopped.signal(signal.SIGCONT)
    wait_for(lambda: all_done(sync, service, total), 60, "every entry to be handled")
    wait_for(lambda: "lost stream" in stopped.output(), 10, "c0 to report its streams lost")
    records = history(sync, service)
    # After SIGCONT, c0 completes at most its one in-flight call per stream.
    late = [x for x in records if x.consumer == "c0" and x.t_ms >= cont_ms and x.stream in owned]
    per_stream = {s: sum(1 for x in late if x.stream == s) for s in owned}
    assert all(n <= 1 for n in per_stream.values()), per_stream
    rt = recovery_time(records, "c0", owned, stop_ms)
    print(f"\nSIGSTOP: owned={len(owned)} takeover_s={rt:.2f} late={len(late)}")
    assert len({(x.stream, x.id) for x in records}) == total
    assert_clean(sync, service, streams)


@pytest.mark.parametrize(
    ("max_retries", "liveness"), [(0, "lock"), (2, "lock"), (0, "session"), (2, "session")]
)
def test_poison_stream_reaches_the_dlq(
    liveness: str,
    server: RedisServer,
    sync: SyncRedis,
    service: str,
    uid: str,
    max_retries: int,
    worker_fleet_factory: WorkerFleetFactory,
) -> None:
    stream = f"d:{uid}:poison"
    args = [*ARGS, "--max-retries", str(max_retries), "--liveness", liveness]
    fleet = worker_fleet_factory(server.url, "tests.faults.workers:PoisonWorker", args)
    dlq = Keys(service).dead_letters
    produce(sync, service, [stream], 3, {"poison": True})
    deaths = 0
    deadline = time.monotonic() + 60
    # One consumer at a time; each dies on the poison stream and is replaced.
    while not sync.xlen(dlq):
        assert time.monotonic() < deadline, "poison stream never reached the DLQ"
        w = fleet.start(f"c{deaths}")
        while w.alive() and not sync.xlen(dlq):
            time.sleep(0.05)
        if w.returncode == -signal.SIGKILL:
            deaths += 1
    [(_, fields)] = list(sync.xrange(dlq) or [])
    assert fields[b"_dlq_reason"] == b"max_retries_exceeded"
    assert int(fields[b"_retry_count"]) == max_retries + 1
    assert fields[b"stream"] == stream.encode()
    assert fields[b"_owner"].startswith(b"c")
    assert fields[b"_source_id"]
    assert fields[b"_source_stream"] == Keys(service).assignments.encode()
    assert deaths == max_retries + 1
    assert_clean(sync, service, [])
    # Under SESSION the last dead owner's lock has a ten-minute TTL: the dead-lettering
    # removes it. (The stream's entries stay pending: the job waits in the DLQ.)
    assert not sync.exists(Keys(service).lock(stream)), "the dead owner's lock was left"


@pytest.mark.parametrize("liveness", ["lock", "session"])
def test_redis_restart_with_aof(
    liveness: str,
    redis_server_factory: RedisServerFactory,
    service: str,
    uid: str,
    worker_fleet_factory: WorkerFleetFactory,
) -> None:
    server = redis_server_factory(appendonly=True)
    r = SyncRedis.from_url(server.url)
    streams = [f"d:{uid}:{i}" for i in range(10)]
    fleet = worker_fleet_factory(server.url, TARGET, [*ARGS, "--liveness", liveness])
    try:
        fleet.start("c0")
        fleet.start("c1")
        total = produce(r, service, streams, 30, {"work_ms": 30})
        wait_for(lambda: len(history(r, service)) > total // 4, 20, "progress before restart")
        r.close()
        server.restart()
        r = SyncRedis.from_url(server.url)
        wait_for(lambda: all_done(r, service, total), 60, "every entry after the restart")
        records = history(r, service)
        assert len({(x.stream, x.id) for x in records}) == total
        print(f"\nrestart: duplicates={sum(duplicates(records).values())}")
        assert_clean(r, service, streams)
    finally:
        r.close()


@pytest.mark.parametrize("liveness", ["lock", "session"])
def test_expiry_lag_does_not_delay_recovery(
    liveness: str,
    redis_server_factory: RedisServerFactory,
    service: str,
    uid: str,
    worker_fleet_factory: WorkerFleetFactory,
) -> None:
    server = redis_server_factory(extra_args=["--hz", "10"])
    r = SyncRedis.from_url(server.url)
    pipe = r.pipeline(transaction=False)
    for i in range(100_000):
        pipe.set(f"unrelated:{i}", "x", ex=3600)
        if i % 10_000 == 9_999:
            pipe.execute()
    pipe.execute()
    streams = [f"d:{uid}:{i}" for i in range(6)]
    fleet = worker_fleet_factory(server.url, TARGET, [*ARGS, "--liveness", liveness])
    try:
        victim = fleet.start("c0")
        total = produce(r, service, streams, 20, {"work_ms": 80})
        owned = wait_for(
            lambda: set(owners(r, service, streams)) if len(history(r, service)) > 3 else set(),
            15,
            "c0 to own streams",
        )
        fleet.start("c1")
        kill_ms = int(time.time() * 1000)
        victim.signal(signal.SIGKILL)
        wait_for(lambda: all_done(r, service, total), 60, "every entry to be handled")
        rt = recovery_time(history(r, service), "c0", owned, kill_ms)
        print(f"\nexpiry lag (100k TTL keys, hz 10): recovery_s={rt:.2f}")
        assert rt < LOCK_TTL_S + MARGIN_S
        assert_clean(r, service, streams)
    finally:
        r.close()


@pytest.mark.parametrize("liveness", ["lock", "session"])
def test_a_kill_between_dead_letter_and_ack_leaves_one_dead_letter(
    liveness: str,
    server: RedisServer,
    sync: SyncRedis,
    service: str,
    uid: str,
    worker_fleet_factory: WorkerFleetFactory,
) -> None:
    """c0 dead-letters "bad", then is killed before its next read acks it; c1 handles
    "bad" again and must not write a second dead letter for it."""
    from streamjobs._wire import build_fields

    stream = f"d:{uid}"
    lbs = Keys(service).assignments
    dlq = Keys(service).dead_letters
    sync.xadd(lbs, build_fields(stream, {}))
    # A first read takes one entry: "a" alone, then "bad" and "die" in one batch.
    ids = {n: sync.xadd(stream, {"n": n}).decode() for n in ("a", "bad", "die", "z")}
    sync.xadd(stream, {"_eos": "1"})
    fleet = worker_fleet_factory(
        server.url, "tests.faults.workers:RejectingWorker", [*ARGS, "--liveness", liveness]
    )
    c0 = fleet.start("c0")
    wait_for(lambda: not c0.alive(), 30, "c0 to die on 'die'")
    assert sync.xlen(dlq) == 1
    assert sync.xpending(stream, service)["pending"] >= 2, "'bad' was acked before the kill"
    fleet.start("c1")
    wait_for(lambda: sync.xlen(lbs) == 0, 30, "c1 to finish the stream")
    letters = list(sync.xrange(dlq) or [])
    assert [f[b"_source_id"].decode() for _, f in letters] == [ids["bad"]], letters
    assert_clean(sync, service, [stream])
