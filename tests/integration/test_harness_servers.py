"""Real-Redis tests of the harness itself: private servers and key cleanup."""

from __future__ import annotations

import time

import pytest
from redis import Redis as SyncRedis
from redis.asyncio import Redis as AsyncRedis

from tests._servers import (
    RESERVED_PORTS,
    RedisServer,
    RedisServerError,
    RedisServerFactory,
    delete_keys_containing,
    pid_alive,
)

pytestmark = pytest.mark.redis


def _client(server: RedisServer) -> SyncRedis:
    return SyncRedis.from_url(server.url, socket_timeout=5, socket_connect_timeout=5)


def _wait_dead(pid: int, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while pid_alive(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


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
    assert _wait_dead(old_pid)
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
    assert _wait_dead(pid), f"redis-server pid {pid} still alive after kill()"
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
    assert _wait_dead(pid)
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
