"""One call for many callers: what stream tasks ask in the same event-loop turn goes
to Redis as one command (docs/design.md#ownership)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

import anyio
import anyio.lowlevel

from .exceptions import RedisUnavailable

K = TypeVar("K")
V = TypeVar("V")


class Coalescer(Generic[K, V]):
    """``await coalescer(item)`` answers ``call([item, ...])[i]`` for the i-th item.

    The first caller of a round waits one event-loop turn, so that the callers started
    in the same turn (the stream tasks of one intake read) join it, then makes the call
    for all of them. A failed call fails every caller of its round with the same
    error. A caller cancelled while it waits leaves the round; a first caller cancelled
    before the call fails the others of its round with :class:`RedisUnavailable`
    (they treat it as any failed call), never leaves them waiting.
    """

    def __init__(self, call: Callable[[Sequence[K]], Awaitable[Sequence[V]]]) -> None:
        self._call = call
        self._round: list[tuple[K, asyncio.Future[V]]] | None = None

    async def __call__(self, item: K) -> V:
        future: asyncio.Future[V] = asyncio.get_running_loop().create_future()
        if self._round is not None:
            self._round.append((item, future))
            return await future
        members = self._round = [(item, future)]
        try:
            try:
                await anyio.lowlevel.checkpoint()  # the others of this turn join
            finally:
                self._round = None
            results = await self._call([k for k, _ in members])
            if len(results) != len(members):
                raise ValueError(f"{len(results)} answers to {len(members)} questions")
        except BaseException as exc:
            failure = (
                exc
                if isinstance(exc, Exception)
                else RedisUnavailable("the call that served this one was cancelled")
            )
            for _, f in members[1:]:
                if not f.done():
                    f.set_exception(failure)
            raise
        for (_, f), result in zip(members, results, strict=False):
            if not f.done():
                f.set_result(result)
        return future.result()
