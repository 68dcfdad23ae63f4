"""OpenTelemetry tracing against real Redis, exported by the SDK's in-memory exporter:
one CONSUMER span per handle() call, a child of the span that appended the entry;
dead letters and hand-backs as spans of their own; nothing when tracing is off."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from streamjobs import ConsumerConfig, DeadLetter, DeadLetters, GroupConsumer, Message, Producer
from tests.harness.plugin import ConsumerFactory, cluster_mode_for

from ._helpers import Recorder, eventually

pytestmark = pytest.mark.anyio


@pytest.fixture
def exporter(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """A tracer provider for this test only: the API's global one is set once per
    process, so it is swapped in and restored rather than set."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", provider)
    yield exporter
    provider.shutdown()


class Refusing(Recorder):
    async def handle(self, message: Message) -> None:
        await super().handle(message)
        if message.fields.get("n") == "bad":
            raise DeadLetter("refused")


async def test_each_handle_call_is_a_consumer_span_child_of_the_producer(
    redis: Any, service: str, uid: str, consumer_factory: ConsumerFactory,
    exporter: InMemorySpanExporter,
) -> None:  # fmt: skip
    producer = Producer(redis, service=service)
    stream = f"traced:{uid}"
    tracer = trace.get_tracer("test")
    await producer.add_stream(stream)
    parents = {}
    for n in ("0", "1", "bad"):
        with tracer.start_as_current_span(f"produce {n}") as span:
            entry_id = await producer.append(stream, {"n": n})
            parents[entry_id] = span.get_span_context()
    plain_id = await producer.append(stream, {"n": "untraced"})  # no span current
    await producer.close_stream(stream)
    assert "traceparent" not in (await redis.xrange(stream, plain_id, plain_id))[0][1]

    consumer = consumer_factory(Refusing, config=ConsumerConfig(max_handler_attempts=1))
    async with consumer:

        async def finished() -> bool:
            return consumer.ended == [stream]

        await eventually(finished)

    spans = exporter.get_finished_spans()
    handled = [s for s in spans if s.kind is SpanKind.CONSUMER]
    assert len(handled) == 4, [s.name for s in spans]
    by_id = {(s.attributes or {})["messaging.message.id"]: s for s in handled}
    for entry_id, parent in parents.items():
        handled_span = by_id[entry_id]
        assert handled_span.parent is not None
        assert handled_span.parent.span_id == parent.span_id
        assert handled_span.context.trace_id == parent.trace_id
        attributes = handled_span.attributes or {}
        assert attributes["messaging.system"] == "redis"
        assert attributes["messaging.destination.name"] == stream
        assert attributes["messaging.consumer.group.name"] == service
        assert attributes["messaging.operation.type"] == "process"
        assert attributes["streamjobs.attempt"] == 1
    assert by_id[plain_id].parent is None  # a root span of its own

    bad_id = next(i for i, s in by_id.items() if s.status.status_code is StatusCode.ERROR)
    assert [e.name for e in by_id[bad_id].events] == ["exception"]
    letters = [s for s in spans if s.name == "streamjobs.dead_letter"]
    assert len(letters) == 1
    assert letters[0].context.trace_id == parents[bad_id].trace_id
    assert (letters[0].attributes or {})["entry_id"] == bad_id


class RefusingGroup(GroupConsumer):
    async def handle(self, message: Message) -> None:
        if message.fields.get("n") == "bad":
            raise DeadLetter("refused")


async def test_a_group_consumer_s_spans_are_children_of_the_entry_s_trace(
    redis: Any, service: str, uid: str, exporter: InMemorySpanExporter
) -> None:
    """Both kinds share one entry pipeline: a GroupConsumer's handle() span and its dead
    letter's span belong to the trace of the span that appended the entry."""
    producer = Producer(redis, service=service)
    stream = f"traced-group:{uid}"
    tracer = trace.get_tracer("test")
    parents = {}
    for n in ("ok", "bad"):
        with tracer.start_as_current_span(f"produce {n}") as span:
            parents[n] = (await producer.append(stream, {"n": n}), span.get_span_context())
    consumer = RefusingGroup(
        redis,
        service=service,
        streams=[stream],
        start_id="0",
        cluster_mode=cluster_mode_for(redis),
        config=ConsumerConfig(max_handler_attempts=1, lock_ttl_s=1.0, read_block_ms=100),
    )
    dlq = DeadLetters(redis, service=service)
    async with consumer:

        async def settled() -> bool:
            return await dlq.length() == 1 and consumer.statistics().entries.get("ok") == 1

        await eventually(settled)
    spans = exporter.get_finished_spans()
    by_id = {
        (s.attributes or {})["messaging.message.id"]: s
        for s in spans
        if s.kind is SpanKind.CONSUMER
    }
    for entry_id, parent in parents.values():
        assert by_id[entry_id].parent is not None
        assert by_id[entry_id].parent.span_id == parent.span_id
        assert (by_id[entry_id].attributes or {})["messaging.consumer.group.name"] == service
    (letter,) = [s for s in spans if s.name == "streamjobs.dead_letter"]
    bad_id, bad_parent = parents["bad"]
    assert letter.context.trace_id == bad_parent.trace_id
    assert (letter.attributes or {})["entry_id"] == bad_id


async def test_a_hand_back_is_a_span(
    redis: Any, service: str, uid: str, consumer_factory: ConsumerFactory,
    exporter: InMemorySpanExporter,
) -> None:  # fmt: skip
    producer = Producer(redis, service=service)
    stream = f"idle:{uid}"
    await producer.add_stream(stream)
    consumer = consumer_factory(Recorder)
    async with consumer:

        async def owns() -> bool:
            return stream in consumer.owned_streams

        await eventually(owns)
    names = [s.name for s in exporter.get_finished_spans()]
    assert names == ["streamjobs.hand_back"]


async def test_no_span_and_no_field_without_a_tracer_provider(
    redis: Any, service: str, uid: str
) -> None:
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    producer = Producer(redis, service=service)
    stream = f"plain:{uid}"
    with trace.get_tracer("test").start_as_current_span("produce"):
        entry_id = await producer.append(stream, {"n": "0"})
    fields = (await redis.xrange(stream, entry_id, entry_id))[0][1]
    assert fields == {b"n": b"0"}  # a no-op span has no context to carry
