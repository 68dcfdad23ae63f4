"""A graceful stop the way supervisors do it: SIGTERM, then SIGKILL 10 s later
(``docker stop``'s default; Kubernetes sends SIGKILL after
``terminationGracePeriodSeconds``). With the default settings the worker must be
gone before the SIGKILL, and must have handed back every stream: the idle ones at
once, the one stuck in a handler when the grace period ends."""

from __future__ import annotations

import signal
import subprocess
import time

import pytest
from redis import Redis as SyncRedis

from streamjobs._keys import Keys
from streamjobs._wire import RETRY_FIELD, build_fields
from streamjobs.testing import RedisServer
from tests.harness.plugin import WorkerFleetFactory

from ._history import owners, wait_for
from .workers import begun_key

SUPERVISOR_WINDOW_S = 10.0
TARGET = "tests.faults.workers:AnnouncingWorker"


@pytest.mark.parametrize("liveness", ["lock", "session"])
def test_sigterm_with_default_settings_hands_everything_back_before_sigkill(
    liveness: str,
    server: RedisServer,
    sync: SyncRedis,
    service: str,
    uid: str,
    worker_fleet_factory: WorkerFleetFactory,
) -> None:
    lbs = Keys(service).assignments
    idle = [f"idle:{uid}:{i}" for i in range(5)]
    busy = f"busy:{uid}"
    for s in idle:
        sync.xadd(lbs, build_fields(s, {}))
    sync.xadd(lbs, build_fields(busy, {"work_ms": 120_000}))  # stuck in its handler
    entry = sync.xadd(busy, {"n": "0"})
    # Defaults but the liveness.
    fleet = worker_fleet_factory(
        server.url, TARGET, ["--concurrency", "10", "--liveness", liveness]
    )  # defaults
    worker = fleet.start("c0")
    wait_for(lambda: sync.lrange(begun_key(service), 0, -1), 20, "the busy handler to start")
    wait_for(
        lambda: (
            set(owners(sync, service, [*idle, busy]).values()) == {"c0"}
            and len(owners(sync, service, [*idle, busy])) == 6
        ),
        20,
        "c0 to own every stream",
    )
    sent = time.monotonic()
    worker.signal(signal.SIGTERM)
    try:
        worker.proc.wait(timeout=SUPERVISOR_WINDOW_S)
    except subprocess.TimeoutExpired:
        worker.kill()  # what the supervisor does
        pytest.fail(f"the worker was still running {SUPERVISOR_WINDOW_S:g}s after SIGTERM")
    took_s = time.monotonic() - sent
    assert worker.proc.returncode == 0, f"exit code {worker.proc.returncode}"
    # Every stream was handed back: unlocked, its assignment re-queued (a new entry,
    # delivered to nobody) without a retry counted.
    assert owners(sync, service, [*idle, busy]) == {}
    assert sync.xpending(lbs, service)["pending"] == 0
    copies = {
        f[b"stream"].decode(): (i.decode(), f.get(RETRY_FIELD.encode()))
        for i, f in sync.xrange(lbs)
    }
    assert sorted(copies) == sorted([*idle, busy])
    assert {retry for _, retry in copies.values()} <= {None, b"0"}, copies
    # The idle streams went back before the busy one, whose handler was cancelled at
    # the end of the grace period: its entry stays pending, for the next owner.
    busy_copy = _ms(copies[busy][0])
    assert all(_ms(copies[s][0]) <= busy_copy for s in idle), copies
    pending = sync.xpending_range(busy, service, "-", "+", 10)
    assert [p["message_id"] for p in pending] == [entry]
    print(f"\nSIGTERM to exit: {took_s:.2f}s")


def _ms(entry_id: str) -> int:
    return int(entry_id.split("-")[0])
