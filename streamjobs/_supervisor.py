"""``streamjobs worker --workers N``: N worker processes under one supervisor.

The supervisor runs no consumer itself. It starts N children, each the same
``streamjobs worker`` command with ``--workers 1`` and a consumer name of its own
(``<name>-<i>`` when a name was given; otherwise each child makes its own unique one),
and a metrics port of its own (``<port> + i``; port 0 stays 0: each child picks a free
one). A child that exits while the supervisor is not stopping is logged and started
again after a backoff (up to 1 s, doubling up to 30 s, back to the shortest once a
child has run for a minute). SIGTERM, SIGINT or SIGHUP is passed on to every child
(the children's first one is their graceful stop, a second one stops them at once)
and the supervisor exits once they all have: 0 if every child stopped cleanly, else 1
(docs/operations.md#exit-codes).

Children run in sessions of their own, so a Ctrl-C at the terminal reaches the
supervisor alone, which passes it on once: a child never takes one keypress for two
signals. On Linux each child is also sent SIGTERM if the supervisor itself dies
(``PR_SET_PDEATHSIG``), so a supervisor killed with SIGKILL leaves no worker behind.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import time
from collections.abc import Sequence

import anyio
import anyio.abc

from ._backoff import Backoff

log = logging.getLogger("streamjobs.supervisor")

RESTART_BASE_S = 1.0
RESTART_CAP_S = 30.0
STABLE_AFTER_S = 60.0
"""A child that ran this long before it exited is restarted after the shortest delay."""


def _stop_with_parent() -> None:
    """In the child, before it runs: SIGTERM when the parent dies (Linux only)."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGTERM))


def child_argv(argv: Sequence[str], index: int, name: str | None, port: int | None) -> list[str]:
    """The command line of child ``index``: ``argv`` (the worker's own arguments,
    after ``worker``) without ``--workers``, ``--consumer-name`` and ``--metrics-port``,
    then those three for this child."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        flag = arg.split("=", 1)[0]
        if flag in ("--workers", "--consumer-name", "--metrics-port"):
            skip = "=" not in arg
            continue
        out.append(arg)
    out += ["--workers", "1"]
    if name is not None:
        out += ["--consumer-name", f"{name}-{index}"]
    if port is not None:
        out += ["--metrics-port", str(port + index if port else 0)]
    return [sys.executable, "-m", "streamjobs", "worker", *out]


class Supervisor:
    """Runs and restarts the children; see the module docstring."""

    def __init__(
        self, argv: Sequence[str], workers: int, name: str | None, port: int | None
    ) -> None:
        self._commands = [child_argv(argv, i, name, port) for i in range(workers)]
        self._stopping = anyio.Event()
        self._children: dict[int, asyncio.subprocess.Process] = {}
        self._codes: dict[int, int] = {}

    async def run(self) -> int:
        async with anyio.create_task_group() as tg:
            await tg.start(self._watch_signals)
            async with anyio.create_task_group() as children:
                for index in range(len(self._commands)):
                    children.start_soon(self._keep, index)
            tg.cancel_scope.cancel()  # every child has ended: stop watching signals
        # A child that had not yet set up its signal handling when the stop came was
        # ended by the signal itself: it held nothing yet, so that is a clean stop too.
        clean = (0, -signal.SIGTERM, -signal.SIGINT)
        failed = {i: c for i, c in self._codes.items() if c not in clean}
        if failed:
            log.error("workers exited with errors: %s", failed)
            return 1
        log.info("all %d workers stopped", len(self._commands))
        return 0

    async def _keep(self, index: int) -> None:
        """Run child ``index``, again after each exit until the supervisor stops."""
        backoff = Backoff(base_s=RESTART_BASE_S, cap_s=RESTART_CAP_S)
        while True:
            started = time.monotonic()
            try:
                process = await asyncio.create_subprocess_exec(
                    *self._commands[index], start_new_session=True, preexec_fn=_stop_with_parent
                )
            except OSError as exc:  # out of processes or memory: not the others' end
                delay = backoff.next_delay()
                log.error("worker %d could not be started (%s): again in %.1fs", index, exc, delay)
                with anyio.move_on_after(delay):
                    await self._stopping.wait()
                if self._stopping.is_set():
                    return
                continue
            self._children[index] = process
            log.info("worker %d started (pid %d)", index, process.pid)
            with anyio.CancelScope(shield=True):
                code = await process.wait()
            del self._children[index]
            self._codes[index] = code
            if self._stopping.is_set():
                log.info("worker %d (pid %d) exited with %d", index, process.pid, code)
                return
            if time.monotonic() - started >= STABLE_AFTER_S:
                backoff.reset()
            delay = backoff.next_delay()
            log.warning(
                "worker %d (pid %d) exited with %d: starting it again in %.1fs",
                index,
                process.pid,
                code,
                delay,
            )
            with anyio.move_on_after(delay):
                await self._stopping.wait()
            if self._stopping.is_set():
                return

    async def _watch_signals(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        stops = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
        with anyio.open_signal_receiver(*stops) as signals:
            task_status.started()
            async for signum in signals:
                self._stopping.set()
                name = signal.Signals(signum).name
                log.info("%s: stopping %d workers", name, len(self._children))
                for process in list(self._children.values()):
                    process.send_signal(signal.SIGTERM if signum == signal.SIGHUP else signum)
