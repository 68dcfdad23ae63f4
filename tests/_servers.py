"""Helpers that run private Redis servers for the test suite.

Nothing here imports :mod:`streamjobs`; the harness must work while the package is
being written.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Final, Literal, Protocol, Self

import redis
import redis.asyncio
from redis.backoff import NoBackoff
from redis.retry import Retry

ENV_REDIS_URL: Final = "STREAMJOBS_TEST_REDIS_URL"
"""Environment variable naming an existing Redis to test against."""

RESERVED_PORTS: Final = range(6379, 6401)
"""Ports :func:`free_port` never returns, to stay clear of other Redis servers."""

RedisSource = Literal["env", "spawn", "docker", "skip", "fail"]

_START_TIMEOUT: Final = 10.0
_STOP_TIMEOUT: Final = 10.0
_POLL_INTERVAL: Final = 0.02
_LOG_TAIL_CHARS: Final = 4000
_BIND_RETRIES: Final = 3

# Every redis-server child still running, so that a crashed test run does not leave
# servers behind (the fixtures stop them properly; this is only a safety net).
_LIVE: set[subprocess.Popen[bytes]] = set()


@atexit.register
def _kill_leftovers() -> None:
    for proc in list(_LIVE):
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        _LIVE.discard(proc)


class RedisServerError(RuntimeError):
    """A private redis-server could not be started."""


def is_ci(env: Mapping[str, str]) -> bool:
    """True when ``CI`` is ``true`` (any case): there a missing Redis is a failure."""
    return env.get("CI", "").strip().lower() == "true"


def choose_redis_source(env: Mapping[str, str], has_binary: bool, has_docker: bool) -> RedisSource:
    """Decide where the session's Redis comes from.

    Order: an explicit URL in ``STREAMJOBS_TEST_REDIS_URL``, then a private
    ``redis-server`` child, then a Docker container.  With none of those the tests are
    skipped, except under ``CI=true`` where they fail instead.
    """
    if env.get(ENV_REDIS_URL, "").strip():
        return "env"
    if has_binary:
        return "spawn"
    if has_docker:
        return "docker"
    return "fail" if is_ci(env) else "skip"


def redis_server_binary() -> str | None:
    """Path of ``redis-server`` on PATH, or None."""
    return shutil.which("redis-server")


def docker_engine_available(timeout: float = 5.0) -> bool:
    """True if a Docker engine answers ``docker info`` within *timeout* seconds."""
    docker = shutil.which("docker")
    if docker is None:
        return False
    try:
        result = subprocess.run(
            [docker, "info", "--format", "{{.ServerVersion}}"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return result.returncode == 0


def free_port() -> int:
    """A currently free TCP port on 127.0.0.1, never one of :data:`RESERVED_PORTS`."""
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port: int = sock.getsockname()[1]
        if port not in RESERVED_PORTS:
            return port
    raise RuntimeError("could not find a free port outside the reserved range")


def _glob_escape(text: str) -> str:
    """Escape Redis glob specials (``* ? [ ] \\``) so *text* matches literally."""
    return "".join("\\" + ch if ch in "*?[]\\" else ch for ch in text)


async def delete_keys_containing(client: redis.asyncio.Redis, fragment: str) -> int:
    """Delete every key whose name contains *fragment*; return how many were deleted.

    Uses SCAN (never KEYS, FLUSHDB or FLUSHALL) and single-key DELs, so it is safe on a
    shared server and does not care about cluster hash slots.
    """
    if not fragment:
        raise ValueError("refusing to delete keys matching an empty fragment")
    pattern = f"*{_glob_escape(fragment)}*"
    deleted = 0
    batch: list[bytes | str] = []

    async def flush() -> int:
        async with client.pipeline(transaction=False) as pipe:
            for key in batch:
                pipe.delete(key)
            results = await pipe.execute()
        batch.clear()
        return sum(int(n) for n in results)

    async for key in client.scan_iter(match=pattern, count=1000):
        batch.append(key)
        if len(batch) >= 500:
            deleted += await flush()
    if batch:
        deleted += await flush()
    return deleted


def ping(host: str, port: int, timeout: float = 0.5) -> bool:
    """True if a Redis at host:port answers PING (LOADING and other errors count as no)."""
    try:
        with redis.Redis(
            host=host,
            port=port,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry=Retry(NoBackoff(), 0),  # the caller polls; no hidden retries
        ) as client:
            return bool(client.ping())
    except (redis.RedisError, OSError):
        return False


class RedisServerFactory(Protocol):
    """Type of the ``redis_server_factory`` fixture: returns a started server."""

    def __call__(
        self,
        *,
        appendonly: bool = False,
        extra_args: Sequence[str] = (),
        port: int | None = None,
    ) -> RedisServer: ...


class RedisServer:
    """A private ``redis-server`` run as a foreground child process.

    It listens on 127.0.0.1 on a free port (fixed for the object's life, so a restart
    comes back on the same port), keeps its files in its own temporary directory, and
    writes its log to ``redis.log`` there.  By default nothing is persisted
    (``--save "" --appendonly no``); ``appendonly=True`` turns on an AOF fsynced on
    every write (``--appendonly yes --appendfsync always``), which survives
    :meth:`restart` and :meth:`kill` followed by :meth:`start`.

    :meth:`stop` is final: it removes the directory.  Use it as a context manager.
    """

    def __init__(
        self,
        *,
        appendonly: bool = False,
        extra_args: Sequence[str] = (),
        port: int | None = None,
        binary: str | None = None,
        start_timeout: float = _START_TIMEOUT,
    ) -> None:
        found = binary or redis_server_binary()
        if found is None:
            raise RedisServerError("redis-server is not on PATH")
        self._binary = found
        self._appendonly = appendonly
        self._extra_args = list(extra_args)
        self._port_fixed = port is not None
        self._port = port if port is not None else free_port()
        self._start_timeout = start_timeout
        self._dir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._started_once = False

    # -- properties -----------------------------------------------------------------

    @property
    def host(self) -> str:
        return "127.0.0.1"

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self._port}/0"

    @property
    def pid(self) -> int:
        """Pid of the running (or last started, if killed) redis-server process."""
        if self._proc is None:
            raise RuntimeError("redis-server has not been started")
        return self._proc.pid

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def directory(self) -> Path:
        if self._dir is None:
            raise RuntimeError("redis-server has no directory (not started, or stopped)")
        return self._dir

    @property
    def log_path(self) -> Path:
        return self.directory / "redis.log"

    def log_tail(self, chars: int = _LOG_TAIL_CHARS) -> str:
        """The end of the server log ('' if there is none)."""
        if self._dir is None:
            return ""
        try:
            data = self.log_path.read_bytes()
        except OSError:
            return ""
        return data[-chars:].decode("utf-8", errors="replace")

    # -- lifecycle --------------------------------------------------------------------

    def command(self) -> list[str]:
        """The redis-server command line (without the binary's own checks)."""
        args = [
            self._binary,
            "--port",
            str(self._port),
            "--bind",
            self.host,
            "--daemonize",
            "no",
            "--dir",
            str(self.directory),
            "--logfile",
            "",
            "--save",
            "",
        ]
        if self._appendonly:
            args += ["--appendonly", "yes", "--appendfsync", "always"]
        else:
            args += ["--appendonly", "no"]
        return args + self._extra_args

    def start(self) -> Self:
        """Start the server and wait (up to ``start_timeout``) until it answers PING."""
        if self.running:
            raise RuntimeError(f"redis-server already running (pid {self.pid})")
        fresh_dir = self._dir is None
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix="streamjobs-redis-"))
        try:
            self._start_in_dir()
        except BaseException:
            if fresh_dir:  # nothing worth keeping; a failed restart keeps its data
                self.stop()
            raise
        self._started_once = True
        return self

    def _start_in_dir(self) -> None:
        attempts = 1 if (self._port_fixed or self._started_once) else _BIND_RETRIES
        for attempt in range(attempts):
            log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
            try:
                self._spawn_and_wait()
            except RedisServerError:
                new_log = self.log_path.read_bytes()[log_offset:] if self.log_path.exists() else b""
                bind_clash = b"Address already in use" in new_log
                if not bind_clash or attempt == attempts - 1:
                    raise
                self._port = free_port()  # someone took our port meanwhile
            else:
                return

    def _spawn_and_wait(self) -> None:
        with open(self.log_path, "ab") as log:
            proc = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.directory,
                start_new_session=True,  # a ^C reaches pytest, which stops us in order
            )
        self._proc = proc
        _LIVE.add(proc)
        deadline = time.monotonic() + self._start_timeout
        while True:
            if proc.poll() is not None:
                self._reap()
                raise RedisServerError(
                    f"redis-server exited with status {proc.returncode} on start "
                    f"(port {self._port}); log tail:\n{self.log_tail()}"
                )
            if ping(self.host, self._port):
                return
            if time.monotonic() >= deadline:
                self._terminate()
                raise RedisServerError(
                    f"redis-server did not answer PING on port {self._port} within "
                    f"{self._start_timeout:.0f}s; log tail:\n{self.log_tail()}"
                )
            time.sleep(_POLL_INTERVAL)

    def _reap(self) -> None:
        if self._proc is not None:
            self._proc.wait()
            _LIVE.discard(self._proc)

    def _terminate(self, timeout: float = _STOP_TIMEOUT) -> None:
        """SIGTERM, wait up to *timeout*, then SIGKILL.  Keeps the directory."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
        self._reap()

    def kill(self) -> None:
        """SIGKILL the server (a crash) and reap it.  Keeps the directory, so a later
        :meth:`start` recovers whatever the AOF holds."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.kill()
        self._reap()

    def restart(self) -> Self:
        """Stop gracefully, then start again on the same port and directory."""
        self._terminate()
        return self.start()

    def stop(self) -> None:
        """Stop for good (SIGTERM, then SIGKILL if needed) and remove the directory.

        Idempotent, and fine after :meth:`kill`."""
        self._terminate()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"pid {self._proc.pid}" if self.running and self._proc else "stopped"
        return f"<RedisServer {self.url} {state}>"


def pid_alive(pid: int) -> bool:
    """True if a process with this pid exists (zombies included)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
