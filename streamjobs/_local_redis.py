"""A throw-away local ``redis-server`` (foreground child, no persistence).

Used by ``streamjobs demo`` when nothing answers at the given URL, and by the
benchmarks for a quiet server of their own.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import redis as redis_sync

_SERVER_START_TIMEOUT_S = 10.0
# Ports a developer's own Redis instances tend to use.
_RESERVED_PORTS = range(6379, 6401)


class LocalRedisError(RuntimeError):
    """The private server could not be started."""


def answers(url: str, timeout_s: float = 0.5) -> bool:
    """True if a Redis at ``url`` answers PING (False if nothing answers or it refuses)."""
    try:
        with redis_sync.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
        ) as client:
            return bool(client.ping())
    except (redis_sync.RedisError, OSError):
        return False


def _free_port() -> int:
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in _RESERVED_PORTS:
            return port
    raise LocalRedisError("no free TCP port outside 6379-6400")


class PrivateRedis:
    """A throw-away ``redis-server`` child (no persistence) on a free local port."""

    def __init__(self, binary: str, prefix: str = "streamjobs-redis-") -> None:
        self.binary = binary
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self._dir = Path(tempfile.mkdtemp(prefix=prefix))

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> str:
        """Start the server and wait until it answers PING; returns its URL.

        Raises:
            LocalRedisError: it did not answer within the start-up timeout.
        """
        for _ in range(3):  # the free port can be taken between probe and bind
            self.port = _free_port()
            with (self._dir / "redis.log").open("ab") as log:
                self.proc = subprocess.Popen(
                    [
                        self.binary,
                        "--port",
                        str(self.port),
                        "--bind",
                        "127.0.0.1",
                        "--save",
                        "",
                        "--appendonly",
                        "no",
                        "--daemonize",
                        "no",
                        "--dir",
                        str(self._dir),
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                )
            deadline = time.monotonic() + _SERVER_START_TIMEOUT_S
            while self.proc.poll() is None and time.monotonic() < deadline:
                if answers(self.url, timeout_s=0.2):
                    return self.url
                time.sleep(0.05)
            self._stop_proc()
        log_tail = (self._dir / "redis.log").read_text(errors="replace")[-2000:]
        raise LocalRedisError(f"could not start a private redis-server:\n{log_tail}")

    def _stop_proc(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def stop(self) -> None:
        self._stop_proc()
        shutil.rmtree(self._dir, ignore_errors=True)


@contextlib.contextmanager
def private_redis(binary: str, prefix: str = "streamjobs-redis-") -> Iterator[PrivateRedis]:
    """Start a :class:`PrivateRedis` for the block and stop it afterwards."""
    server = PrivateRedis(binary, prefix)
    try:
        server.start()
        yield server
    finally:
        server.stop()
