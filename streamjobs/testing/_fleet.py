"""``streamjobs worker`` subprocesses: :class:`Worker` and :class:`WorkerFleet`."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Self

from ._process import (
    _CHILDREN,
    _STOP_TIMEOUT_S,
    WorkerError,
    _reap,
    _tail,
)


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
                # A process group of its own: in a group shared with the caller, a
                # caller started in the background (``nohup ... &``) makes the group
                # orphaned, and the kernel then sends SIGHUP and SIGCONT to all of it
                # whenever a member exits while another is SIGSTOPped, which stops a
                # worker gracefully in the middle of a stall fault. Signals go to each
                # worker by pid, so nothing else changes.
                start_new_session=True,
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
