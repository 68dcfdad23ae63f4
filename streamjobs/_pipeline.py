"""The entry pipeline, shared by any consumer kind: the user's hooks, calling
``handle()`` (a coroutine, or a plain function in a worker thread) within its
timeout, and the pure decision after a failure (``Retry``, ``DeadLetter``, attempts,
backoff) (docs/design.md#handling-entries)."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, cast

import anyio
import anyio.to_thread

from ._deadletter import describe_error
from .exceptions import (
    DeadLetter,
    HandlerTimeout,
    Retry,
)
from .message import Message


@dataclass(frozen=True, slots=True)
class RetryAfter:
    """Call ``handle()`` again for the same entry after ``delay_s``."""

    delay_s: float


@dataclass(frozen=True, slots=True)
class GiveUp:
    """Dead-letter the entry with ``error`` as its ``_error``, then go on.

    ``rejected`` is the handler's own reason when it raised ``DeadLetter`` (the dead
    letter's reason is then ``rejected``), None when it kept failing."""

    error: str
    rejected: str | None = None


def after_failure(
    error: BaseException,
    attempt: int,
    *,
    max_attempts: int,
    backoff_s: float,
    backoff_max_s: float,
) -> RetryAfter | GiveUp:
    """The next step after attempt number ``attempt`` (1-based) of an entry raised ``error``.

    * :class:`~streamjobs.DeadLetter`: give up now.
    * Attempts used up (``attempt >= max_attempts``): give up.
    * :class:`~streamjobs.Retry`: retry after its ``delay_s`` (it counts as an attempt).
    * Anything else: retry after ``backoff_s * 2**(attempt - 1)``, capped at
      ``backoff_max_s``.
    """
    if isinstance(error, DeadLetter):
        return GiveUp(f"DeadLetter: {error.reason}", rejected=error.reason)
    if attempt >= max_attempts:
        return GiveUp(describe_error(error))
    if isinstance(error, Retry):
        return RetryAfter(error.delay_s)
    exponent = min(attempt - 1, 64)  # 2**64 times any backoff is past every cap
    return RetryAfter(min(backoff_max_s, backoff_s * 2.0**exponent))


# -- what a stream needs from its consumer --------------------------------------------------


class Hooks(Protocol):
    """The user's side of the contract (``StreamConsumer`` satisfies it). ``handle`` is
    a coroutine function or a plain function (run in a worker thread: see
    :func:`entry_caller`)."""

    def handle(self, message: Message[Any]) -> Awaitable[None] | None: ...
    async def on_startup(self) -> None: ...
    async def on_shutdown(self) -> None: ...
    async def on_stream_start(self, stream: str, info: Mapping[str, Any]) -> None: ...
    async def on_stream_end(self, stream: str) -> None: ...
    async def on_stream_lost(self, stream: str) -> None: ...
    async def on_stream_cancelled(self, stream: str, reason: str) -> None: ...


SYNC_HANDLER_THREADS = 40
"""Worker threads one consumer runs a plain ``def handle()`` in at most: further calls
wait for a thread (docs/design.md#handling-entries)."""


def handler_kind_problem(handle: Any) -> str | None:
    """Why ``handle`` cannot be a handler (None if it can): it must be a coroutine
    function or a plain function; a generator of either kind would never run its body
    as a call."""
    if inspect.isasyncgenfunction(handle):
        return "an async generator function (it yields)"
    if inspect.isgeneratorfunction(handle):
        return "a generator function (it yields)"
    if not callable(handle):
        return f"not callable ({type(handle).__name__})"
    return None


def entry_caller(
    handle: Callable[[Message[Any]], Awaitable[None] | None],
) -> Callable[[Message[Any]], Awaitable[None]]:
    """``handle`` as a coroutine function.

    A coroutine function is returned as it is. A plain function runs in a worker thread
    (``anyio.to_thread``, at most :data:`SYNC_HANDLER_THREADS` at once per consumer),
    with the same retries, timeout and dead letters: its exceptions are the call's. A
    call past ``handler_timeout_s``, or cancelled at shutdown, stops waiting for the
    thread, which runs on until the function returns (a thread cannot be interrupted),
    holding its slot. If the function returns an awaitable (a plain ``def`` wrapping
    a coroutine, say), that is awaited on the event loop.
    """
    if inspect.iscoroutinefunction(handle):
        return cast("Callable[[Message[Any]], Awaitable[None]]", handle)
    limiter: anyio.CapacityLimiter | None = None  # made in the event loop, at first use

    async def call_in_thread(message: Message[Any]) -> None:
        nonlocal limiter
        if limiter is None:
            limiter = anyio.CapacityLimiter(SYNC_HANDLER_THREADS)
        result = await anyio.to_thread.run_sync(
            handle, message, limiter=limiter, abandon_on_cancel=True
        )
        if inspect.isawaitable(result):
            await result

    return call_in_thread


async def _call_within(
    handle: Callable[[Message[Any]], Awaitable[None]], timeout_s: float, message: Message[Any]
) -> None:
    """``handle(message)``, cancelled past ``timeout_s`` (a failed attempt)."""
    with anyio.move_on_after(timeout_s) as scope:
        await handle(message)
    if scope.cancelled_caught:
        raise HandlerTimeout(f"handle() did not return within {timeout_s}s")
