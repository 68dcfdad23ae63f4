"""The life of a consumer's ``run()``, the same for both consumer kinds: one run at a
time, stopped from outside (``aclose()``), ready once its loops are up, the user's
``on_startup`` and ``on_shutdown`` hooks, and ``async with consumer``.

Each kind's runtime holds a :class:`Lifecycle` and wraps its own loops in
:meth:`Lifecycle.running`; what runs inside differs, how a run begins and ends does not.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import anyio.abc

from .exceptions import HookFailed, StreamJobsError

log = logging.getLogger("streamjobs")


class Lifecycle:
    """One consumer's runs.

    Args:
        hooks: the user's object: its ``on_startup`` and ``on_shutdown`` are called.

    Attributes:
        active: a run is under way (from :meth:`running`'s entry to its exit).
        stop: set by :meth:`aclose` (or leaving ``async with``): the run winds down.
        ready: set by the run once its loops are up.
    """

    def __init__(self, hooks: Any) -> None:
        self.hooks = hooks
        self.active = False
        self.stop = anyio.Event()
        self.ready = anyio.Event()
        self._stopped = anyio.Event()
        self._background: anyio.abc.TaskGroup | None = None

    @property
    def started(self) -> bool:
        """Running, and its loops are up."""
        return self.active and self.ready.is_set()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """One run: refused while another runs; at its end (whatever ended it) the
        user's ``on_shutdown``, shielded, then a fresh stop signal and readiness for
        the next run. (Reset at the end, not at the start, so that an ``aclose()``
        that came before the run got going still stops it.)"""
        if self.active:
            raise StreamJobsError("this consumer is already running")
        self.active = True
        self._stopped = anyio.Event()
        try:
            yield
        finally:
            try:
                await self.shut_down(raising=sys.exc_info()[0] is not None)
            finally:
                self.active = False
                self.stop = anyio.Event()
                self.ready = anyio.Event()
                self._stopped.set()

    async def hook(self, name: str) -> None:
        """Call the user's lifecycle hook ``name``; what it raises becomes
        :class:`HookFailed`, naming it (cancellation passes through)."""
        try:
            await getattr(self.hooks, name)()
        except Exception as exc:
            raise HookFailed(name, exc) from exc

    async def shut_down(self, *, raising: bool) -> None:
        """``on_shutdown``, last in ``run()``. Shielded: it runs when ``run()`` is
        cancelled too. Its error is raised only when ``run()`` is not ending with
        another one (``raising``); then it is logged."""
        with anyio.CancelScope(shield=True):
            try:
                await self.hook("on_shutdown")
            except HookFailed as exc:
                if not raising:
                    raise
                log.error("%s (while run() ended with another error)", exc)

    async def wait_ready(self) -> None:
        await self.ready.wait()

    async def aclose(self) -> None:
        """Ask the run to stop, and wait until it has."""
        self.stop.set()
        if self.active:
            await self._stopped.wait()

    async def enter(self, run: Callable[..., Awaitable[None]]) -> None:
        """``async with consumer``: start ``run`` (which takes ``task_status``) in a task
        group of its own and wait until it reports started.

        Raises:
            whatever ``run`` raised before it started (``HookFailed``,
            ``RedisUnavailable``, ...), not a task group's exception group around it.
        """
        tg = anyio.create_task_group()
        await tg.__aenter__()
        try:
            await tg.start(_started, run)
        except BaseException as exc:
            try:
                await tg.__aexit__(type(exc), exc, exc.__traceback__)
            except BaseExceptionGroup as group:
                if group.exceptions == (exc,):
                    raise exc from None
                raise
            raise
        self._background = tg

    async def exit(self) -> None:
        """Leaving ``async with``: stop the run and wait until it has returned."""
        self.stop.set()
        tg, self._background = self._background, None
        assert tg is not None
        await tg.__aexit__(None, None, None)


async def _started(
    run: Callable[..., Awaitable[None]], *, task_status: anyio.abc.TaskStatus[None]
) -> None:
    await run(task_status=task_status)
