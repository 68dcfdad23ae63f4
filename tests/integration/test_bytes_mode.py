"""Bytes mode (``StreamConsumer[bytes]``) against real Redis: ``handle()`` gets the
fields' bytes exactly as written, and everything the framework itself reads from an
entry (the end marker, a cancel, a replay's origin, a dead letter, the trace context)
still works (docs/concepts.md#bytes-mode)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from streamjobs import (
    ConsumerConfig,
    DeadLetter,
    DeadLetters,
    Message,
    Producer,
    StreamConsumer,
)
from streamjobs._keys import Keys
from tests.harness.plugin import ConsumerFactory

from ._helpers import eventually

pytestmark = pytest.mark.anyio

BINARY = bytes(range(256))  # not UTF-8


class Raw(StreamConsumer[bytes]):
    """Records every message; dead-letters ``n=bad`` until ``fixed``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seen: list[Message[bytes]] = []
        self.ended: list[str] = []
        self.cancelled: list[tuple[str, str]] = []
        self.fixed = False

    async def handle(self, message: Message[bytes]) -> None:
        if message.fields.get(b"n") == b"bad" and not self.fixed:
            raise DeadLetter("bad for now")
        self.seen.append(message)

    async def on_stream_end(self, stream: str) -> None:
        self.ended.append(stream)

    async def on_stream_cancelled(self, stream: str, reason: str) -> None:
        self.cancelled.append((stream, reason))


class RawChild(Raw):
    """A subclass of a bytes consumer is one too."""


def test_the_declaration_sets_the_mode() -> None:
    class Text(StreamConsumer):
        async def handle(self, message: Message) -> None: ...

    class Explicit(StreamConsumer[str]):
        async def handle(self, message: Message[str]) -> None: ...

    assert (Raw.fields_type, RawChild.fields_type) == (bytes, bytes)
    assert (Text.fields_type, Explicit.fields_type) == (str, str)


async def test_handle_gets_the_bytes_as_written_and_the_end_marker_ends_it(
    redis: Any, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    producer = Producer(redis, service=service)
    stream = f"raw:{uid}"
    await producer.add_stream(stream, {"k": "v"})
    ids = [await producer.append(stream, {"n": str(i), "blob": BINARY}) for i in range(5)]
    await producer.close_stream(stream)
    c = consumer_factory(RawChild, config=ConsumerConfig(read_block_ms=200))
    async with c:

        async def ended() -> bool:
            return c.ended == [stream]

        await eventually(ended)
    assert [m.id for m in c.seen] == ids
    for i, m in enumerate(c.seen):
        assert m.fields == {b"n": str(i).encode(), b"blob": BINARY}
        assert (m.stream, m.info, m.attempt, m.replayed_from) == (stream, {"k": "v"}, 1, None)
    assert await redis.exists(Keys(service).lock(stream)) == 0


async def test_a_dead_letter_keeps_the_bytes_and_its_replay_reaches_handle(
    redis: Any, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    producer = Producer(redis, service=service)
    stream = f"raw:{uid}"
    await producer.add_stream(stream)
    bad_id = await producer.append(stream, {"n": "bad", "blob": BINARY})
    await producer.append(stream, {"n": "ok"})
    await producer.close_stream(stream)
    c = consumer_factory(Raw, config=ConsumerConfig(read_block_ms=200))
    async with c:

        async def first_done() -> bool:
            return c.ended == [stream]

        await eventually(first_done)
        letters = DeadLetters(redis, service=service)
        [record] = await letters.list()
        assert record.source_id == bad_id
        [(_, stored)] = await redis.xrange(Keys(service).dead_letters)
        assert stored[b"blob"] == BINARY, "the dead letter must hold the original bytes"
        c.fixed = True
        await letters.replay([record.id])

        async def replayed() -> bool:
            return len(c.ended) == 2

        await eventually(replayed)
    assert [m.fields[b"n"] for m in c.seen] == [b"ok", b"bad"]
    again = c.seen[1]
    assert again.replayed_from == bad_id
    assert again.fields[b"blob"] == BINARY
    assert await redis.xlen(Keys(service).dead_letters) == 0


async def test_cancel_and_finish_end_a_bytes_stream(
    redis: Any, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    producer = Producer(redis, service=service)
    cancelled, finished = f"raw:c:{uid}", f"raw:f:{uid}"
    for stream in (cancelled, finished):
        await producer.add_stream(stream)
        await producer.append(stream, {"n": "0"})
    c = consumer_factory(Raw, config=ConsumerConfig(read_block_ms=200))
    async with c:

        async def both_handled() -> bool:
            return {m.stream for m in c.seen} == {cancelled, finished}

        await eventually(both_handled)
        await producer.cancel_stream(cancelled, "no longer wanted")
        c.finish(finished)

        async def both_ended() -> bool:
            return c.cancelled == [(cancelled, "no longer wanted")] and c.ended == [finished]

        await eventually(both_ended)
    keys = Keys(service)
    assert await redis.exists(keys.lock(cancelled), keys.lock(finished)) == 0


@pytest.fixture
def exporter(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", provider)
    yield exporter
    provider.shutdown()


async def test_the_trace_context_is_read_from_bytes_fields(
    redis: Any, service: str, uid: str, consumer_factory: ConsumerFactory,
    exporter: InMemorySpanExporter,
) -> None:  # fmt: skip
    producer = Producer(redis, service=service)
    stream = f"raw:{uid}"
    await producer.add_stream(stream)
    with trace.get_tracer("test").start_as_current_span("produce") as span:
        entry_id = await producer.append(stream, {"n": "0"})
        parent = span.get_span_context()
    await producer.close_stream(stream)
    c = consumer_factory(Raw)
    async with c:

        async def ended() -> bool:
            return c.ended == [stream]

        await eventually(ended)
    [handled] = [s for s in exporter.get_finished_spans() if s.kind is SpanKind.CONSUMER]
    assert (handled.attributes or {})["messaging.message.id"] == entry_id
    assert handled.parent is not None
    assert handled.parent.span_id == parent.span_id
