"""The coalescer that lets the stream tasks of one intake read share one Redis call."""

from __future__ import annotations

from collections.abc import Sequence

import anyio
import pytest

from streamjobs._coalesce import Coalescer
from streamjobs.exceptions import RedisUnavailable

pytestmark = pytest.mark.anyio


class Calls:
    def __init__(self, fail: BaseException | None = None) -> None:
        self.calls: list[list[int]] = []
        self.fail = fail
        self.gate = anyio.Event()
        self.gate.set()

    async def __call__(self, items: Sequence[int]) -> list[int]:
        self.calls.append(list(items))
        await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        return [10 * i for i in items]


async def test_callers_started_in_one_turn_share_one_call() -> None:
    calls = Calls()
    coalesce: Coalescer[int, int] = Coalescer(calls)
    answers: dict[int, int] = {}

    async def ask(i: int) -> None:
        answers[i] = await coalesce(i)

    async with anyio.create_task_group() as tg:
        for i in range(5):
            tg.start_soon(ask, i)
    assert calls.calls == [[0, 1, 2, 3, 4]]
    assert answers == {i: 10 * i for i in range(5)}


async def test_a_caller_after_the_call_went_out_starts_the_next_round() -> None:
    calls = Calls()
    calls.gate = anyio.Event()
    coalesce: Coalescer[int, int] = Coalescer(calls)
    answers: dict[int, int] = {}

    async def ask(i: int) -> None:
        answers[i] = await coalesce(i)

    async with anyio.create_task_group() as tg:
        tg.start_soon(ask, 1)
        tg.start_soon(ask, 2)
        while not calls.calls:
            await anyio.lowlevel.checkpoint()
        tg.start_soon(ask, 3)  # the first call is in flight: a round of its own
        while len(calls.calls) < 2:
            await anyio.lowlevel.checkpoint()
        calls.gate.set()
    assert calls.calls == [[1, 2], [3]]
    assert answers == {1: 10, 2: 20, 3: 30}


async def test_a_failed_call_fails_every_caller_of_its_round() -> None:
    coalesce: Coalescer[int, int] = Coalescer(Calls(fail=RedisUnavailable("down")))
    failures: list[str] = []

    async def ask(i: int) -> None:
        try:
            await coalesce(i)
        except RedisUnavailable as exc:
            failures.append(str(exc))

    async with anyio.create_task_group() as tg:
        for i in range(3):
            tg.start_soon(ask, i)
    assert failures == ["down"] * 3


async def test_a_first_caller_cancelled_leaves_no_one_waiting() -> None:
    calls = Calls()
    calls.gate = anyio.Event()  # the call hangs until the first caller is cancelled
    coalesce: Coalescer[int, int] = Coalescer(calls)
    outcomes: dict[int, str] = {}

    async def ask(i: int, scope: anyio.CancelScope | None = None) -> None:
        try:
            outcomes[i] = str(await coalesce(i))
        except RedisUnavailable:
            outcomes[i] = "unavailable"

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            first = anyio.CancelScope()

            async def leader() -> None:
                with first:
                    await ask(0)

            tg.start_soon(leader)
            tg.start_soon(ask, 1)
            tg.start_soon(ask, 2)
            while not calls.calls:
                await anyio.lowlevel.checkpoint()
            first.cancel()
    assert outcomes == {1: "unavailable", 2: "unavailable"}
    # The next round works.
    calls.gate.set()
    assert await coalesce(7) == 70


async def test_a_wrong_number_of_answers_is_an_error_for_all() -> None:
    async def short(items: Sequence[int]) -> list[int]:
        return [1]

    coalesce: Coalescer[int, int] = Coalescer(short)
    errors: list[type[BaseException]] = []

    async def ask(i: int) -> None:
        try:
            await coalesce(i)
        except ValueError as exc:
            errors.append(type(exc))

    async with anyio.create_task_group() as tg:
        for i in range(2):
            tg.start_soon(ask, i)
    assert errors == [ValueError, ValueError]
