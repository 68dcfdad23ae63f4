"""Any input ends in success, a clear error, or (for a consumer) a dead letter.

Assignment parsing sees whatever anyone XADDed; producer input is whatever a caller
passes. Neither may raise anything but the documented errors.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from streamjobs import InvalidAssignment, InvalidStreamName
from streamjobs._keys import Keys
from streamjobs._wire import Assignment, build_fields, parse_assignment

KEYS = Keys("svc")

names = st.one_of(
    st.text(max_size=30),
    st.text(alphabet="{}:ab \t\n\x00é", max_size=12),
    st.sampled_from(["", "{", "}", "{}", "a{b}c", "{a}}", "streamjobs:{svc}:lbs", "x" * 10_000]),
)
raw_values = st.one_of(
    st.binary(max_size=64),
    st.text(max_size=64),
    st.sampled_from([b"", b"\xff\xfe", b"[" * 5000, b"{" * 5000, b'{"a":' * 3000]),
)
json_values: st.SearchStrategy[Any] = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=20,
)


@settings(max_examples=300)
@given(
    st.dictionaries(
        st.sampled_from(["stream", "info", "_retry_count", "lbs-input", "extra"]) | st.text(),
        raw_values | names,
        max_size=5,
    )
)
def test_parsing_any_fields_succeeds_or_is_invalid(fields: dict[str, Any]) -> None:
    result = _parse(fields)
    if isinstance(result, InvalidAssignment):
        assert str(result), "an unexplained refusal"
        return
    KEYS.check_data_stream(result.stream)  # what parses is a usable name
    assert result.retry_count >= 0


def _parse(fields: dict[str, Any]) -> Assignment | InvalidAssignment:
    """The parsed assignment, or the refusal; any other exception fails the test."""
    try:
        return parse_assignment("1-0", fields, KEYS)
    except InvalidAssignment as exc:
        return exc


@settings(max_examples=200)
@given(names, json_values)
def test_producer_input_is_accepted_or_refused_clearly(name: str, info: Any) -> None:
    refused: InvalidStreamName | None = None
    try:
        KEYS.check_data_stream(name)
        fields = build_fields(name, info if isinstance(info, dict) else {"v": info})
    except InvalidStreamName as exc:
        refused = exc
    if refused is not None:
        assert refused.name in (name, repr(name)), "the error does not name the stream"
        assert refused.reason
        return
    # What the producer writes, the consumer reads back as the same job.
    parsed = parse_assignment("1-0", fields, KEYS)
    assert parsed.stream == name
    assert json.loads(fields["info"]) == dict(parsed.info)


@given(st.integers(min_value=1, max_value=200_000))
def test_any_nesting_depth_is_handled(depth: int) -> None:
    result = _parse({"stream": "s", "info": "[" * depth + "]" * depth})
    # A nested array is never an object: refused, whatever the depth, never a crash.
    assert isinstance(result, InvalidAssignment)
