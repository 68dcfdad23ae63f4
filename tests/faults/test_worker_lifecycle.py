"""``streamjobs worker`` with lifecycle hooks and factories, as real processes:
``on_startup`` runs before the first stream is taken and ``on_shutdown`` after the
last is handed back; a factory (sync or async) builds a consumer whose ``__init__``
needs more than the consumer's own arguments; what cannot be built, and a startup
hook that fails, are one line each."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis import Redis as SyncRedis

from streamjobs._wire import build_fields
from streamjobs.testing import RedisServer
from tests.harness.plugin import RedisServerFactory, WorkerFleetFactory

from ._history import owners, wait_for
from .workers import lifecycle_key, log_key

pytestmark = pytest.mark.faults

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def redis_server(redis_server_factory: RedisServerFactory) -> RedisServer:
    return redis_server_factory()


@pytest.fixture
def sync(redis_server: RedisServer) -> Iterator[SyncRedis]:
    r = SyncRedis(port=redis_server.port)
    yield r
    r.close()


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
    redis_server: RedisServer,
    sync: SyncRedis,
    service: str,
    uid: str,
    worker_fleet_factory: WorkerFleetFactory,
    target: str,
) -> None:
    lbs = f"streamjobs:{{{service}}}:lbs"
    streams = [f"d:{uid}:{i}" for i in range(2)]
    for s in streams:
        sync.xadd(lbs, build_fields(s, {"work_ms": 1}))
        sync.xadd(s, {"n": "0"})
    fleet = worker_fleet_factory(
        _url(redis_server), f"tests.faults.workers:{target}", ["--grace", "2"]
    )
    worker = fleet.start("c0")
    wait_for(lambda: sync.llen(log_key(service)) == 2, 30, "both entries to be handled")
    assert len(owners(sync, service, streams)) == 2  # still open: no end marker
    worker.signal(signal.SIGTERM)
    assert worker.proc.wait(timeout=15) == 0, worker.log_tail(20)
    # on_startup ran before any stream was owned; on_shutdown after every stream was
    # handed back.
    assert sync.lrange(lifecycle_key(service), 0, -1) == [b"startup owned=0", b"shutdown owned=0"]
    assert owners(sync, service, streams) == {}


def test_a_class_that_cannot_be_built_is_one_line(redis_server: RedisServer, service: str) -> None:
    r = _run("tests.faults.workers:PooledWorker", service, redis_server)
    assert r.returncode == 2, r.stderr
    [line] = r.stderr.strip().splitlines()
    assert line.startswith(
        "streamjobs: error: cannot build the consumer: class tests.faults.workers:PooledWorker "
        "raised TypeError:"
    ), line
    assert "db_url" in line
    assert "factory" in line


def test_a_failing_startup_hook_is_one_line_and_takes_nothing(
    redis_server: RedisServer, sync: SyncRedis, service: str, uid: str
) -> None:
    lbs = f"streamjobs:{{{service}}}:lbs"
    stream = f"d:{uid}"
    sync.xadd(lbs, build_fields(stream, {"work_ms": 1}))
    r = _run("tests.faults.workers:FailingStartup", service, redis_server)
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
    redis_server: RedisServer, service: str, tmp_path: Path
) -> None:
    (tmp_path / "broken_app.py").write_text("import os\nSETTINGS = {}\nDB = SETTINGS['db']\n")
    r = subprocess.run(
        [sys.executable, "-m", "streamjobs", "worker", "broken_app:Worker", "--service",
         service, "--redis-url", _url(redis_server)],
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
