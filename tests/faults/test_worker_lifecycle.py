"""``streamjobs worker`` with lifecycle hooks and factories, as real processes:
``on_startup`` runs before the first stream is taken and ``on_shutdown`` after the
last is handed back; a factory (sync or async) builds a consumer whose ``__init__``
needs more than the consumer's own arguments; what cannot be built, and a startup
hook that fails, are one line each."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from redis import Redis as SyncRedis

from streamjobs._keys import Keys
from streamjobs._wire import build_fields
from streamjobs.testing import RedisServer
from tests.harness.plugin import WorkerFleetFactory
from tests.harness.processes import pid_alive

from ._history import owners, wait_for
from .workers import lifecycle_key, log_key

ROOT = Path(__file__).resolve().parents[2]


def _url(server: RedisServer) -> str:
    return f"redis://127.0.0.1:{server.port}/0"


def _run(
    target: str, service: str, server: RedisServer, *args: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "streamjobs", "worker", target, "--service", service,
         "--redis-url", _url(server), *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip


@pytest.mark.parametrize("target", ["make_pooled", "make_pooled_async"])
def test_a_factory_builds_the_consumer_and_its_hooks_bracket_the_work(
    server: RedisServer,
    sync: SyncRedis,
    service: str,
    uid: str,
    worker_fleet_factory: WorkerFleetFactory,
    target: str,
) -> None:
    lbs = Keys(service).assignments
    streams = [f"d:{uid}:{i}" for i in range(2)]
    for s in streams:
        sync.xadd(lbs, build_fields(s, {"work_ms": 1}))
        sync.xadd(s, {"n": "0"})
    fleet = worker_fleet_factory(_url(server), f"tests.faults.workers:{target}", ["--grace", "2"])
    worker = fleet.start("c0")
    wait_for(lambda: sync.llen(log_key(service)) == 2, 30, "both entries to be handled")
    assert len(owners(sync, service, streams)) == 2  # still open: no end marker
    worker.signal(signal.SIGTERM)
    assert worker.proc.wait(timeout=15) == 0, worker.log_tail(20)
    # on_startup ran before any stream was owned; on_shutdown after every stream was
    # handed back.
    assert sync.lrange(lifecycle_key(service), 0, -1) == [b"startup owned=0", b"shutdown owned=0"]
    assert owners(sync, service, streams) == {}


def test_a_class_that_cannot_be_built_is_one_line(server: RedisServer, service: str) -> None:
    r = _run("tests.faults.workers:PooledWorker", service, server)
    assert r.returncode == 2, r.stderr
    [line] = r.stderr.strip().splitlines()
    assert line.startswith(
        "streamjobs: error: cannot build the consumer: class tests.faults.workers:PooledWorker "
        "raised TypeError:"
    ), line
    assert "db_url" in line
    assert "factory" in line


def test_a_failing_startup_hook_is_one_line_and_takes_nothing(
    server: RedisServer, sync: SyncRedis, service: str, uid: str
) -> None:
    lbs = Keys(service).assignments
    stream = f"d:{uid}"
    sync.xadd(lbs, build_fields(stream, {"work_ms": 1}))
    r = _run("tests.faults.workers:FailingStartup", service, server)
    assert r.returncode == 1, r.stderr
    errors = [line for line in r.stderr.splitlines() if "Traceback" in line or "error" in line]
    assert errors == [
        "streamjobs: error: on_startup() raised ConnectionRefusedError: database at "
        "db://nowhere refused the connection"
    ], r.stderr
    assert sync.lrange(lifecycle_key(service), 0, -1) == [b"shutdown"]
    assert owners(sync, service, [stream]) == {}
    assert sync.xpending(lbs, service)["pending"] == 0, "an assignment was read"


def test_an_import_error_names_its_type_file_and_line(
    server: RedisServer, service: str, tmp_path: Path
) -> None:
    (tmp_path / "broken_app.py").write_text("import os\nSETTINGS = {}\nDB = SETTINGS['db']\n")
    r = subprocess.run(
        [sys.executable, "-m", "streamjobs", "worker", "broken_app:Worker", "--service",
         service, "--redis-url", _url(server)],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"},
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert r.returncode == 2
    [line] = r.stderr.strip().splitlines()
    assert line == (
        f"streamjobs: error: cannot import module 'broken_app': KeyError: 'db' "
        f"({tmp_path / 'broken_app.py'}:3)"
    )


def test_status_tells_a_stopped_worker_from_a_killed_one(
    server: RedisServer,
    sync: SyncRedis,
    service: str,
    uid: str,
    worker_fleet_factory: WorkerFleetFactory,
) -> None:
    # A consumer is listed once it has read the assignment stream: one stream each.
    lbs = Keys(service).assignments
    for i in range(2):
        sync.xadd(lbs, build_fields(f"d:{uid}:{i}", {"work_ms": 1}))
    fleet = worker_fleet_factory(
        _url(server),
        "tests.faults.workers:RecordingWorker",
        # LOCK liveness: the killed one's lock expires by itself (under SESSION it
        # stays until another consumer recovers it, and status counts its holder in).
        ["--lock-ttl", "1", "--concurrency", "1", "--liveness", "lock"],
    )
    stopped, killed = fleet.start("stopped"), fleet.start("killed")

    def states() -> dict[str, str]:
        r = subprocess.run(
            [sys.executable, "-m", "streamjobs", "status", "--service", service, "--json",
             "--redis-url", _url(server)],
            cwd=ROOT, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        if r.returncode == 1 and "no service" in r.stderr:
            return {}  # no worker has created the group yet
        assert r.returncode == 0, r.stderr
        return {c["name"]: c["state"] for c in json.loads(r.stdout)["consumers"]}

    wait_for(lambda: states() == {"stopped": "alive", "killed": "alive"}, 30, "both alive")
    stopped.signal(signal.SIGTERM)
    assert stopped.proc.wait(timeout=15) == 0
    killed.signal(signal.SIGKILL)
    killed.proc.wait(timeout=15)
    # The killed one's session expires after a lock TTL; the stopped one ended its own.
    wait_for(lambda: states() == {"stopped": "stopped", "killed": "dead"}, 30, "stopped and dead")
    assert sync.hget(Keys(service).stopped, "killed") is None


def test_workers_n_runs_restarts_and_stops_them_all(
    server: RedisServer, sync: SyncRedis, service: str, uid: str
) -> None:
    """``--workers 2``: two consumers (NAME-0, NAME-1); one killed with SIGKILL is
    started again and logged; SIGTERM to the supervisor stops both gracefully (every
    stream handed back), exit 0, and no process is left."""
    lbs = Keys(service).assignments
    streams = [f"d:{uid}:{i}" for i in range(4)]
    for s in streams:
        sync.xadd(lbs, build_fields(s, {"work_ms": 1}))
        sync.xadd(s, {"n": "0"})
    supervisor = subprocess.Popen(
        [sys.executable, "-m", "streamjobs", "worker", "tests.faults.workers:RecordingWorker",
         "--service", service, "--redis-url", _url(server), "--workers", "2",
         "--consumer-name", "w", "--lock-ttl", "2"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    try:
        wait_for(lambda: sync.llen(log_key(service)) == 4, 30, "every entry handled")
        assert set(owners(sync, service, streams).values()) <= {"w-0", "w-1"}
        children = _children_of(supervisor.pid)
        assert len(children) == 2, children
        victim = children[0]
        name = _consumer_name_of(victim)
        held = {
            s: t
            for s, t in _lock_tokens(sync, service, streams).items()
            if owners(sync, service, [s])[s] == name
        }
        os.kill(victim, signal.SIGKILL)
        wait_for(
            lambda: (
                len(_children_of(supervisor.pid)) == 2
                and victim not in _children_of(supervisor.pid)
            ),
            30,
            "the killed worker to be started again",
        )

        def resumed() -> bool:  # its session expired, its locks recovered and retaken
            now = _lock_tokens(sync, service, streams)
            return all(now.get(s) not in (None, token) for s, token in held.items())

        wait_for(resumed, 30, f"the streams {name} held to be resumed")
        survivors = _children_of(supervisor.pid)
        supervisor.send_signal(signal.SIGTERM)
        out, _ = supervisor.communicate(timeout=30)
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
            supervisor.communicate()
    assert supervisor.returncode == 0, out
    assert "exited with -9: starting it again in" in out
    assert "SIGTERM: stopping 2 workers" in out
    assert owners(sync, service, streams) == {}, "a lock was left behind"
    assert all(not pid_alive(p) for p in survivors), "a worker outlived the supervisor"


def _children_of(pid: int) -> list[int]:
    """The live child processes of ``pid`` (Linux ``/proc``)."""
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def _consumer_name_of(pid: int) -> str:
    args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    return args[args.index(b"--consumer-name") + 1].decode()


def _lock_tokens(sync: SyncRedis, service: str, streams: list[str]) -> dict[str, Any]:
    tokens = {s: sync.get(Keys(service).lock(s)) for s in streams}
    return {s: t for s, t in tokens.items() if t is not None}
