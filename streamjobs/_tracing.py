"""OpenTelemetry tracing, through the API only (docs/operations.md#tracing).

The producer injects the W3C trace context of the current span into a data entry's
``traceparent`` (and ``tracestate``) fields; the consumer extracts it and wraps each
``handle()`` call in a CONSUMER span, a child of the producer's. Re-queues, dead
letters, hand-backs and lost streams are short spans of their own.

With no tracer provider configured (the API's default proxy, or the no-op one) every
function here returns at once: :func:`tracer` is looked up once per read batch, and
the hot path then calls ``handle()`` directly.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.propagators.textmap import Getter
from opentelemetry.trace import SpanKind, Tracer
from opentelemetry.util.types import AttributeValue

from .message import Message

_SYSTEM = "redis"
_IDLE = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)
_cached: tuple[object, Tracer] | None = None


def _text(value: Any) -> str:
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else str(value)


class _FieldsGetter(Getter[Mapping[Any, Any]]):
    """Reads the trace context from an entry's fields, as text or as bytes (a
    consumer in bytes mode)."""

    def get(self, carrier: Mapping[Any, Any], key: str) -> list[str] | None:
        value = carrier.get(key)
        if value is None:
            value = carrier.get(key.encode())
        return None if value is None else [_text(value)]

    def keys(self, carrier: Mapping[Any, Any]) -> list[str]:
        return [_text(k) for k in carrier]


_GETTER = _FieldsGetter()


def tracer() -> Tracer | None:
    """The tracer of the configured provider, or None when tracing is off."""
    global _cached
    provider = trace.get_tracer_provider()
    if isinstance(provider, _IDLE):
        return None
    if _cached is None or _cached[0] is not provider:
        from . import __version__

        _cached = (provider, provider.get_tracer("streamjobs", __version__))
    return _cached[1]


def inject(fields: Mapping[str, Any]) -> Mapping[str, Any]:
    """``fields`` plus the current trace context, if there is one to carry."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    if not carrier:
        return fields
    return {**carrier, **fields}  # a field the caller set wins


async def handle_in_span(
    t: Tracer,
    handle: Callable[[Message[Any]], Awaitable[None]],
    message: Message[Any],
    *,
    group: str,
    consumer: str,
) -> None:
    """``handle(message)`` inside a CONSUMER span parented to the producer's context.

    An exception is recorded on the span (status ERROR) and re-raised.
    """
    parent = propagate.extract(message.fields, getter=_GETTER)
    attributes: dict[str, AttributeValue] = {
        "messaging.system": _SYSTEM,
        "messaging.operation.type": "process",
        "messaging.operation.name": "handle",
        "messaging.destination.name": message.stream,
        "messaging.message.id": message.id,
        "messaging.consumer.group.name": group,
        "messaging.client.id": consumer,
        "streamjobs.attempt": message.attempt,
    }
    with t.start_as_current_span(
        "process", context=parent, kind=SpanKind.CONSUMER, attributes=attributes
    ):
        await handle(message)


def mark(
    name: str,
    attributes: Mapping[str, AttributeValue],
    parent: Mapping[Any, Any] | None = None,
) -> None:
    """Record a point event (``streamjobs.requeue``, ``streamjobs.dead_letter``, ...)
    as a span of its own, a child of ``parent``'s trace context when given."""
    t = tracer()
    if t is None:
        return
    context = propagate.extract(parent, getter=_GETTER) if parent else None
    with t.start_as_current_span(
        name, context=context, kind=SpanKind.INTERNAL, attributes=attributes
    ):
        pass
