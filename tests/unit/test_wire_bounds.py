"""Errors about bad assignments quote a bounded prefix of any value, with its size."""

from __future__ import annotations

import json

import pytest

from streamjobs import InvalidAssignment
from streamjobs._wire import QUOTE_MAX_CHARS, clip, parse_assignment, quote

MB = 1024 * 1024


def test_quote_keeps_short_values_and_notes_the_size_of_long_ones() -> None:
    assert quote("abc") == "'abc'"
    assert quote("x" * QUOTE_MAX_CHARS) == repr("x" * QUOTE_MAX_CHARS)
    long = quote("é" * MB)
    assert long == f"{'é' * QUOTE_MAX_CHARS!r}…({2 * MB} bytes)"
    raw = b"\xff" * 300
    assert quote(raw) == f"{raw[:QUOTE_MAX_CHARS]!r}…(300 bytes)"
    assert clip("y" * 10, 4) == "yyyy…(10 bytes)"
    assert clip("short") == "short"


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"stream": "s" * MB}, "is 1048576 bytes long"),
        ({"stream": "s:1", "_retry_count": "x" * MB}, "_retry_count must be a non-negative"),
        ({"stream": "s:1", "info": "{" + "x" * MB}, "info is not valid JSON"),
        ({"stream": "s:1", "info": "[" * MB}, "RecursionError"),
        ({"stream": "{" * MB}, "invalid stream name"),
        ({"lbs-input": json.dumps({"DataStreamName": "}" * MB})}, "invalid stream name"),
        ({"lbs-input": "x" * MB}, "lbs-input is not valid JSON"),
    ],
)
def test_a_huge_bad_value_gives_a_short_message(fields: dict[str, str], says: str) -> None:
    with pytest.raises(InvalidAssignment) as caught:
        parse_assignment("1-1", fields)
    message = str(caught.value)
    assert says in message
    assert len(message) < 1000, message[:300]
    if QUOTE_MAX_CHARS * "x" in message or QUOTE_MAX_CHARS * "s" in message:
        assert "…(1048576 bytes)" in message
