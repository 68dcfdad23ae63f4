"""Real-Redis tests of the harness itself: private servers, worker fleets, key cleanup."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from redis import Redis as SyncRedis
from redis.asyncio import Redis as AsyncRedis

from streamjobs.testing import (
    RESERVED_PORTS,
    PortInUseError,
    RedisServer,
    RedisServerError,
    WorkerError,
    WorkerFleet,
    answers,
)
from tests.harness.keys import delete_keys_containing
from tests.harness.plugin import ROOT, RedisServerFactory
from tests.harness.processes import pid_alive, wait_dead


def _client(server: RedisServer) -> SyncRedis:
    return SyncRedis.from_url(server.url, socket_timeout=5, socket_connect_timeout=5)


def test_server_starts_and_answers_ping(redis_server_factory: RedisServerFactory) -> None:
    server = redis_server_factory()
    assert server.running
    assert server.port not in RESERVED_PORTS
    assert server.url == f"redis://127.0.0.1:{server.port}/0"
    assert pid_alive(server.pid)
    with _client(server) as client:
        assert client.ping() is True
        config = client.config_get("appendonly")
        assert config == {"appendonly": "no"}
        assert client.config_get("save") == {"save": ""}


def test_extra_args_are_passed(redis_server_factory: RedisServerFactory) -> None:
    server = redis_server_factory(extra_args=["--hz", "42"])
    with _client(server) as client:
        assert client.config_get("hz") == {"hz": "42"}


def test_restart_with_appendonly_keeps_data(redis_server_factory: RedisServerFactory) -> None:
    server = redis_server_factory(appendonly=True)
    port, old_pid, directory = server.port, server.pid, server.directory
    with _client(server) as client:
        assert client.config_get("appendfsync") == {"appendfsync": "always"}
        client.set("harness-key", b"survives")
    server.restart()
    assert (server.port, server.directory) == (port, directory)
    assert server.pid != old_pid
    assert wait_dead(old_pid)
    with _client(server) as client:
        assert client.get("harness-key") == b"survives"


@pytest.mark.faults
def test_kill_really_kills_and_aof_survives_a_crash(
    redis_server_factory: RedisServerFactory,
) -> None:
    server = redis_server_factory(appendonly=True)
    with _client(server) as client:
        client.set("harness-key", b"crash-safe")
    pid = server.pid
    server.kill()
    assert not server.running
    assert wait_dead(pid), f"redis-server pid {pid} still alive after kill()"
    server.start()
    with _client(server) as client:
        assert client.get("harness-key") == b"crash-safe"


@pytest.mark.usefixtures("require_redis_server")
def test_stop_is_idempotent_and_removes_directory() -> None:
    server = RedisServer()
    with server:
        directory = server.directory
        pid = server.pid
        assert directory.is_dir()
        assert (directory / "redis.log").is_file()
    assert not directory.exists()
    assert wait_dead(pid)
    server.stop()
    server.kill()
    assert not server.running


@pytest.mark.usefixtures("require_redis_server")
def test_start_failure_reports_log_tail() -> None:
    server = RedisServer(extra_args=["--no-such-directive", "x"])
    try:
        with pytest.raises(RedisServerError, match="no-such-directive"):
            server.start()
        assert not server.running
    finally:
        server.stop()


@pytest.mark.anyio
async def test_delete_keys_containing_only_removes_matching_keys(
    redis_server_factory: RedisServerFactory, uid: str
) -> None:
    server = redis_server_factory()
    client = AsyncRedis.from_url(server.url)
    try:
        mine = [f"sj:{{{uid}}}:stream", f"svc-{uid}", f"x{uid}y", f"{uid}"]
        mine += [f"bulk:{uid}:{i}" for i in range(1200)]  # more than one SCAN/DEL batch
        others = ["sj:{other}:stream", f"svc-{uid[:-1]}", "unrelated"]
        for key in mine + others:
            await client.set(key, b"1")
        await client.xadd(f"stream-{uid}", {b"f": b"v"})
        mine.append(f"stream-{uid}")

        assert await delete_keys_containing(client, uid) == len(mine)
        assert await client.exists(*mine) == 0
        assert await client.exists(*others) == len(others)
        assert await delete_keys_containing(client, uid) == 0
    finally:
        await client.aclose()


@pytest.mark.anyio
async def test_delete_keys_containing_treats_glob_chars_literally(
    redis_server_factory: RedisServerFactory,
) -> None:
    server = redis_server_factory()
    client = AsyncRedis.from_url(server.url)
    try:
        await client.set("a[b]*c", b"1")
        await client.set("abc", b"1")
        await client.set("aXc", b"1")
        assert await delete_keys_containing(client, "[b]*") == 1
        assert await client.exists("abc", "aXc") == 2
        with pytest.raises(ValueError, match="empty"):
            await delete_keys_containing(client, "")
    finally:
        await client.aclose()


@pytest.mark.anyio
async def test_redis_fixture_gives_a_bytes_client(redis: AsyncRedis, uid: str) -> None:
    await redis.set(f"harness:{uid}", "value")
    assert await redis.get(f"harness:{uid}") == b"value"
    assert await redis.ping() is True


@pytest.mark.usefixtures("require_redis_server")
def test_a_taken_fixed_port_is_port_in_use() -> None:
    with RedisServer() as first:
        second = RedisServer(port=first.port)
        try:
            # PING on that port is answered, but by `first`: no false start.
            with pytest.raises(PortInUseError, match="Address already in use"):
                second.start()
            assert not second.running
        finally:
            second.stop()
        assert answers(first.url)


@pytest.mark.usefixtures("require_redis_server")
def test_a_given_directory_is_kept_and_the_wait_can_come_later(tmp_path: Path) -> None:
    directory = tmp_path / "node"
    server = RedisServer(directory=directory)
    try:
        server.start(wait=False)
        server.wait_ready()
        assert server.directory == directory
        assert answers(server.url)
    finally:
        server.stop()
    assert not server.running
    assert (directory / "redis.log").is_file()


@pytest.mark.faults
def test_pause_resume_and_stop_while_paused(redis_server_factory: RedisServerFactory) -> None:
    server = redis_server_factory()
    server.pause()
    assert not answers(server.url, timeout_s=0.2)
    server.resume()
    assert answers(server.url, timeout_s=5)
    server.pause()
    pid = server.pid
    server.stop(timeout_s=5)  # a paused server must still stop gracefully
    assert wait_dead(pid)


@pytest.mark.faults
def test_worker_fleet_starts_kills_and_stops(
    redis_server_factory: RedisServerFactory, service: str
) -> None:
    server = redis_server_factory()
    fleet = WorkerFleet(
        server.url,
        service,
        "tests.faults.workers:RecordingWorker",
        ["--grace", "1"],
        pythonpath=[ROOT],
        cwd=ROOT,
    )
    try:
        a, b = fleet.start("a"), fleet.start("b")
        assert fleet.wait_started(30) == []
        assert fleet.started(a)
        assert fleet.by_name("b") is b
        b.kill()
        assert b.killed
        assert b.returncode == -signal.SIGKILL
        assert fleet.alive() == [a]
        log_dir = fleet.log_dir
        assert (log_dir / "a.log").is_file()
        assert fleet.stop_all(timeout_s=15) == []
        assert a.returncode == 0, a.log_tail()
    finally:
        fleet.close()
    fleet.close()  # idempotent
    assert not log_dir.exists()
    with pytest.raises(RuntimeError, match="closed"):
        fleet.start("c")


def test_a_worker_that_cannot_start_is_reported(service: str) -> None:
    with WorkerFleet("redis://127.0.0.1:1/0", service, "no_such_module_xyz:C") as fleet:
        fleet.start("x")
        with pytest.raises(WorkerError, match="cannot import module"):
            fleet.wait_started(30)
