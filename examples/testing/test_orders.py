"""Testing a consumer with no Redis server: ``streamjobs.testing.fake_redis()``.

Run it with ``python -m pytest examples/testing/test_orders.py`` (after
``pip install 'streamjobs[testing]' pytest``). The consumer under test totals the
quantities of each order stream: a quantity that is not a number is dead-lettered, and
a warehouse that is briefly away is retried.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import anyio
import pytest

from streamjobs import (
    ConsumerConfig,
    DeadLetter,
    DeadLetters,
    Message,
    Producer,
    Retry,
    StreamConsumer,
)
from streamjobs.testing import fake_redis

pytestmark = pytest.mark.anyio


class Orders(StreamConsumer):
    """The consumer under test."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.totals: dict[str, int] = {}
        self.ended: list[str] = []
        self.warehouse_down = False
        self.words: dict[str, int] = {}  # quantities written out: none known yet

    async def handle(self, message: Message) -> None:
        quantity = message.fields["qty"]
        if not quantity.isdigit() and quantity not in self.words:
            raise DeadLetter(f"bad quantity {quantity!r}")
        if self.warehouse_down:
            self.warehouse_down = False  # back on the next attempt
            raise Retry(delay_s=0.01)
        count = self.words.get(quantity) or int(quantity)
        self.totals[message.stream] = self.totals.get(message.stream, 0) + count

    async def on_stream_end(self, stream: str) -> None:
        self.ended.append(stream)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def eventually(check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Wait until ``check()`` is true (the consumer runs in the background)."""
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await anyio.sleep(0.01)


async def queue_order(producer: Producer, stream: str, *quantities: str) -> None:
    await producer.add_stream(stream)
    for quantity in quantities:
        await producer.append(stream, {"qty": quantity})
    await producer.close_stream(stream)


async def test_an_order_is_totalled_retrying_a_warehouse_that_was_away() -> None:
    redis = fake_redis()
    await queue_order(Producer(redis, service="orders"), "order:1", "2", "3")
    consumer = Orders(redis, service="orders", config=ConsumerConfig(read_block_ms=50))
    consumer.warehouse_down = True
    async with consumer:
        await eventually(lambda: consumer.ended == ["order:1"])
    assert consumer.totals == {"order:1": 5}
    assert consumer.statistics().entries == {"ok": 1, "retried": 1}


async def test_a_bad_line_is_dead_lettered_and_replayed_once_the_handler_is_fixed() -> None:
    redis = fake_redis()
    await queue_order(Producer(redis, service="orders"), "order:2", "4", "six")
    consumer = Orders(redis, service="orders", config=ConsumerConfig(read_block_ms=50))
    letters = DeadLetters(redis, service="orders")
    async with consumer:
        await eventually(lambda: consumer.ended == ["order:2"])
        [letter] = await letters.list()
        assert (letter.source_stream, letter.rejected) == ("order:2", "bad quantity 'six'")
        assert letter.fields == {"qty": "six"}
        assert consumer.totals == {"order:2": 4}

        consumer.words["six"] = 6  # the fix ships
        report = await letters.replay([letter.id])
        assert [r.target for r in report.replayed] == ["order:2"]
        await eventually(lambda: consumer.ended == ["order:2", "order:2"])
    assert consumer.totals == {"order:2": 10}
    assert await letters.list() == []
