"""``async with consumer``, for either consumer kind: its ``run()`` in a task group of
its own, started (its loops up) on entry and stopped on exit."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
import anyio.abc


class Background:
    """``run`` (a consumer's ``run``, which takes ``task_status``) in the background."""

    def __init__(self) -> None:
        self._tg: anyio.abc.TaskGroup | None = None

    async def start(self, run: Callable[..., Awaitable[None]]) -> None:
        """Start ``run`` and wait until it reports started.

        Raises:
            whatever ``run`` raised before it started (``HookFailed``,
            ``RedisUnavailable``, ...), not a task group's exception group around it.
        """
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        try:
            await self._tg.start(_started, run)
        except BaseException as exc:
            tg, self._tg = self._tg, None
            try:
                await tg.__aexit__(type(exc), exc, exc.__traceback__)
            except BaseExceptionGroup as group:
                if group.exceptions == (exc,):
                    raise exc from None
                raise
            raise

    async def wait(self) -> None:
        """Wait until ``run`` has returned (the caller has asked it to stop)."""
        assert self._tg is not None
        tg, self._tg = self._tg, None
        await tg.__aexit__(None, None, None)


async def _started(
    run: Callable[..., Awaitable[None]], *, task_status: anyio.abc.TaskStatus[None]
) -> None:
    await run(task_status=task_status)
