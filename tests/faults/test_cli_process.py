"""``streamjobs worker`` as operators run it: behind a password given outside the
command line, and stopped by SIGHUP (a closed terminal or session)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from redis import Redis as SyncRedis

from streamjobs._keys import Keys
from streamjobs._wire import build_fields
from streamjobs.testing import RedisServer
from tests.harness.plugin import RedisServerFactory, WorkerFleetFactory

from ._history import owners, wait_for
from .workers import begun_key

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "S3cretPW-x9"
TARGET = "tests.faults.workers:AnnouncingWorker"


@pytest.fixture
def server(redis_server_factory: RedisServerFactory) -> RedisServer:
    """A private server behind ``PASSWORD`` (the folder's ``sync`` logs in with it)."""
    return redis_server_factory(password=PASSWORD)


def _url(server: RedisServer, password: str) -> str:
    return f"redis://default:{password}@127.0.0.1:{server.port}/0"


def _worker(service: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "streamjobs", "worker", TARGET, "--service", service, *args],
        cwd=ROOT,
        env={**os.environ, **(env or {}), "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_a_wrong_password_is_one_line_without_the_password(
    server: RedisServer, service: str
) -> None:
    proc = _worker(service, "--redis-url", _url(server, "wrong-" + PASSWORD))
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2, out
    assert PASSWORD not in out
    lines = out.strip().splitlines()
    assert len(lines) == 1, out
    assert lines[0].startswith("streamjobs: error: cannot reach Redis at redis://default:***@")


@pytest.mark.parametrize("source", ["env", "file"])
def test_the_url_given_outside_the_command_line_connects_and_stays_out_of_ps(
    server: RedisServer, sync: SyncRedis, service: str, uid: str, tmp_path: Path, source: str
) -> None:
    stream = f"d:{uid}"
    sync.xadd(Keys(service).assignments, build_fields(stream, {"work_ms": 1}))
    sync.xadd(stream, {"n": "0"})
    if source == "env":
        proc = _worker(service, env={"STREAMJOBS_REDIS_URL": _url(server, PASSWORD)})
    else:
        url_file = tmp_path / "redis-url"
        url_file.write_text(_url(server, PASSWORD) + "\n")
        url_file.chmod(0o600)
        proc = _worker(service, "--redis-url-file", str(url_file))
    try:
        wait_for(lambda: sync.lrange(begun_key(service), 0, -1), 30, "the entry to be handled")
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
        assert PASSWORD.encode() not in cmdline
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert PASSWORD not in out


def test_sighup_stops_gracefully_and_hands_streams_back(
    server: RedisServer,
    sync: SyncRedis,
    service: str,
    uid: str,
    worker_fleet_factory: WorkerFleetFactory,
) -> None:
    lbs = Keys(service).assignments
    streams = [f"d:{uid}:{i}" for i in range(3)]
    for s in streams:
        sync.xadd(lbs, build_fields(s, {"work_ms": 1}))
        sync.xadd(s, {"n": "0"})
    fleet = worker_fleet_factory(_url(server, PASSWORD), TARGET, ["--grace", "2"])
    worker = fleet.start("c0")
    wait_for(lambda: len(owners(sync, service, streams)) == 3, 30, "c0 to own the streams")
    wait_for(lambda: sync.llen(begun_key(service)) == 3, 30, "every entry to be handled")
    worker.signal(signal.SIGHUP)
    assert worker.proc.wait(timeout=15) == 0
    assert "SIGHUP: shutting down gracefully" in worker.log_tail(20)
    assert owners(sync, service, streams) == {}, "a lock was left behind"
    assert sync.xpending(lbs, service)["pending"] == 0
    assert sorted(f[b"stream"].decode() for _, f in sync.xrange(lbs)) == streams  # re-queued
    for s in streams:
        assert sync.xpending(s, service)["pending"] == 0, f"{s}: its handled entry is unacked"


def test_a_worker_started_with_sighup_ignored_keeps_ignoring_it(
    server: RedisServer, sync: SyncRedis, service: str, uid: str
) -> None:
    """As under ``nohup``: the worker outlives its terminal; SIGTERM still stops it."""
    stream = f"d:{uid}"
    sync.xadd(Keys(service).assignments, build_fields(stream, {"work_ms": 1}))
    sync.xadd(stream, {"n": "0"})
    ignoring_sighup = (
        "import os, signal, sys; signal.signal(signal.SIGHUP, signal.SIG_IGN); "
        "os.execv(sys.executable, [sys.executable, '-m', 'streamjobs', *sys.argv[1:]])"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", ignoring_sighup, "worker", TARGET, "--service", service],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "STREAMJOBS_REDIS_URL": server.url},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for(lambda: sync.lrange(begun_key(service), 0, -1), 30, "the entry to be handled")
        proc.send_signal(signal.SIGHUP)  # discarded by the kernel: it is ignored
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert "SIGTERM: shutting down gracefully" in out
    assert "SIGHUP" not in out
    assert owners(sync, service, [stream]) == {}
