"""Recorders of the user's own: a partial one (written against an older protocol)
keeps working, an object that is no recorder is refused naming the field."""

from __future__ import annotations

from typing import Any

import pytest

from streamjobs import (
    ConfigurationError,
    EntryOutcome,
    MetricsRecorder,
    NullRecorder,
    PrometheusRecorder,
    StreamEvent,
)
from streamjobs.metrics import EVENTS, complete


class OnlyEvents:
    """A recorder that knows one method."""

    def __init__(self) -> None:
        self.events: list[StreamEvent] = []

    def stream_event(self, service: str, event: StreamEvent) -> None:
        self.events.append(event)


def test_a_partial_recorder_gets_the_missing_methods_as_no_ops() -> None:
    inner = OnlyEvents()
    recorder = complete(inner)
    assert isinstance(recorder, MetricsRecorder)
    recorder.stream_event("svc", StreamEvent.ACQUIRED)
    recorder.entries_handled("svc", EntryOutcome.OK, [0.001])  # absent: nothing happens
    recorder.recovery_latency("svc", 1.5)
    assert inner.events == [StreamEvent.ACQUIRED]


@pytest.mark.parametrize("recorder", [NullRecorder(), PrometheusRecorder()])
def test_full_recorders_are_used_as_they_are(recorder: Any) -> None:
    assert complete(recorder) is recorder
    assert all(callable(getattr(recorder, name)) for name in EVENTS)


def test_something_that_is_no_recorder_is_refused_naming_the_field() -> None:
    with pytest.raises(ConfigurationError) as info:
        complete(object())
    assert info.value.field == "metrics"
