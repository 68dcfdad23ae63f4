from __future__ import annotations

import contextlib
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamjobs import DeadLetterReason, InvalidAssignment, InvalidStreamName
from streamjobs._notifications import merge_flags
from streamjobs._recovery import Action, decide
from streamjobs._wire import build_fields, parse_assignment


def test_parse_native_and_go_formats() -> None:
    a = parse_assignment("1-0", {"stream": b"s1", "info": b'{"k": 1}', "_retry_count": b"2"})
    assert (a.stream, dict(a.info), a.retry_count) == ("s1", {"k": 1}, 2)
    go = json.dumps({"DataStreamName": "s2", "Info": {"x": "y"}})
    b = parse_assignment("2-0", {"lbs-input": go})
    assert (b.stream, dict(b.info), b.retry_count) == ("s2", {"x": "y"}, 0)
    c = parse_assignment("3-0", {"stream": "s3"})
    assert dict(c.info) == {}


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"info": b"{}"},
        {"stream": b""},
        {"stream": b"a}b"},
        {"stream": b"\xff\xfe"},
        {"stream": b"s", "info": b"{not json"},
        {"stream": b"s", "info": b"[1, 2]"},
        {"stream": b"s", "_retry_count": b"-1"},
        {"stream": b"s", "_retry_count": b"x"},
        {"lbs-input": b"{}"},
        {"lbs-input": b'{"DataStreamName": 5}'},
        {"lbs-input": b"\x00\x01"},
    ],
)
def test_malformed_assignments_raise(fields: dict[str, bytes]) -> None:
    with pytest.raises(InvalidAssignment):
        parse_assignment("1-0", fields)


@given(st.dictionaries(st.text(max_size=8), st.binary(max_size=16), max_size=4))
def test_parse_never_raises_anything_but_invalid_assignment(fields: dict[str, bytes]) -> None:
    with contextlib.suppress(InvalidAssignment):
        parse_assignment("1-0", dict(fields))


def test_build_fields_rejects_bad_names() -> None:
    with pytest.raises(InvalidStreamName):
        build_fields("a}b", None)
    assert build_fields("s", {"a": 1}) == {"stream": "s", "info": '{"a":1}'}


def test_decide_table() -> None:
    ok = parse_assignment("1-0", {"stream": "s", "_retry_count": "1"})
    bad = InvalidAssignment("x")
    assert decide(ok, lock_exists=True, max_retries=3, raw_retry=1).action is Action.SKIP_ALIVE
    d = decide(ok, lock_exists=False, max_retries=3, raw_retry=1)
    assert (d.action, d.retry_count) == (Action.REQUEUE, 2)
    d = decide(ok, lock_exists=False, max_retries=1, raw_retry=1)
    assert (d.action, d.reason, d.retry_count) == (
        Action.DEAD_LETTER,
        DeadLetterReason.MAX_RETRIES_EXCEEDED,
        2,
    )
    fresh = parse_assignment("1-0", {"stream": "s"})
    d = decide(fresh, lock_exists=False, max_retries=0, raw_retry=0)
    assert d.reason is DeadLetterReason.MAX_RETRIES_EXCEEDED
    # Unparseable goes to the DLQ whatever the lock says.
    d = decide(bad, lock_exists=True, max_retries=3, raw_retry=0)
    assert (d.action, d.reason) == (Action.DEAD_LETTER, DeadLetterReason.UNPARSEABLE)


@given(st.integers(0, 20), st.integers(0, 20), st.booleans())
def test_decide_retry_counts_never_exceed_max(retries: int, max_retries: int, alive: bool) -> None:
    a = parse_assignment("1-0", {"stream": "s", "_retry_count": str(retries)})
    d = decide(a, lock_exists=alive, max_retries=max_retries, raw_retry=retries)
    if alive:
        assert d.action is Action.SKIP_ALIVE
    elif d.action is Action.REQUEUE:
        assert d.retry_count == retries + 1 <= max_retries
    else:
        assert d.retry_count == retries + 1 > max_retries


@pytest.mark.parametrize(
    ("current", "expected"),
    [("", "Kx"), ("Kx", None), ("KA", None), ("Ex", "ExK"), ("KEA", None), ("lg", "lgKx")],
)
def test_merge_flags_keeps_existing_flags(current: str, expected: str | None) -> None:
    assert merge_flags(current, "Kx") == expected
