"""A subclass owns its namespace: the framework keeps its state out of the user's way."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from redis.asyncio import Redis as AsyncRedis

from streamjobs import ConsumerConfig, Message, Producer, RecoveryConfig, StreamConsumer
from streamjobs._keys import Keys
from tests.harness.plugin import ConsumerFactory

from ._helpers import eventually

pytestmark = pytest.mark.anyio


class Clashing(StreamConsumer):
    """Uses the private names a framework would be tempted to use for itself."""

    def __init__(self, redis: Any, **kwargs: Any) -> None:
        super().__init__(redis, **kwargs)
        self._config = "the user's config"
        self._owned: list[str] = []
        self._name = "the user's name"
        self._redis = None
        self._finished: list[str] = []

    async def _process(self, *args: object) -> None:
        raise AssertionError("the framework called the subclass's _process")

    async def _finish(self, *args: object) -> None:
        raise AssertionError("the framework called the subclass's _finish")

    async def _run(self, *args: object) -> None:
        raise AssertionError("the framework called the subclass's _run")

    async def handle(self, message: Message) -> None:
        self._owned.append(message.fields["n"])

    async def on_stream_start(self, stream: str, info: Mapping[str, Any]) -> None:
        assert self._config == "the user's config"

    async def on_stream_end(self, stream: str) -> None:
        self._finished.append(stream)


async def test_a_subclass_may_define_any_private_name(
    redis: AsyncRedis, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    stream = f"data:{uid}"
    producer = Producer(redis, service=service)
    await producer.add_stream(stream)
    for i in range(5):
        await producer.append(stream, {"n": str(i)})
    await producer.close_stream(stream)
    c = consumer_factory(
        Clashing,
        config=ConsumerConfig(lock_ttl_s=2, read_block_ms=50),
        recovery=RecoveryConfig(min_idle_s=3),
    )
    async with c:

        async def done() -> bool:
            return c._finished == [stream]

        await eventually(done, timeout_s=10)
    assert c._owned == ["0", "1", "2", "3", "4"]
    assert (c._config, c._name, c._redis) == ("the user's config", "the user's name", None)
    assert c.service == service
    assert await redis.exists(Keys(service).lock(stream)) == 0


class Plain(StreamConsumer):
    async def handle(self, message: Message) -> None:
        pass


async def test_the_framework_keeps_one_instance_attribute_and_no_private_methods(
    consumer_factory: ConsumerFactory,
) -> None:
    c = consumer_factory(Plain)
    assert set(vars(c)) == {"_BaseConsumer__runtime"}
    private = {
        name
        for name in vars(StreamConsumer)
        if name.startswith("_") and not name.startswith("__") and name != "_abc_impl"
    }
    assert private == set()
