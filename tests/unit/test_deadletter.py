"""The dead-letter format: what is built parses back, and parsing never raises."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from streamjobs import DeadLetterReason
from streamjobs._deadletter import (
    DEAD_AT_FIELD,
    ERROR_MAX_CHARS,
    META_FIELDS,
    assignment_meta,
    entry_dead_letter,
    parse_dead_letter,
)
from streamjobs._wire import RETRY_FIELD

field_names = st.text(min_size=1, max_size=12)
values = st.text(max_size=40)


@given(st.dictionaries(field_names, values, max_size=6), st.integers(1, 50), values)
def test_a_data_entry_dead_letter_parses_back(
    fields: dict[str, str], attempts: int, error: str
) -> None:
    letter = dict(
        entry_dead_letter(
            fields,
            stream="call:42",
            entry_id="7-1",
            retry_count=2,
            attempts=attempts,
            owner="c1",
            error=error,
        )
    )
    letter[DEAD_AT_FIELD] = "1700000000000"  # the script's part
    record = parse_dead_letter("9-0", letter)
    assert record.reason is DeadLetterReason.HANDLER_FAILED
    assert (record.source_stream, record.source_id) == ("call:42", "7-1")
    assert (record.retry_count, record.attempts, record.owner) == (2, attempts, "c1")
    assert record.error == error[:ERROR_MAX_CHARS]
    assert record.dead_at_ms == 1_700_000_000_000
    assert not record.is_assignment
    # Original fields survive, except those whose names the metadata uses.
    assert record.fields == {k: v for k, v in fields.items() if k not in META_FIELDS}


def test_metadata_replaces_original_fields_of_the_same_name() -> None:
    letter = dict(
        entry_dead_letter(
            {"_attempts": "99", "_dlq_reason": "forged", "n": "1"},
            stream="s",
            entry_id="1-1",
            retry_count=0,
            attempts=3,
            owner="",
            error="",
        )
    )
    assert letter["_attempts"] == "3"
    assert letter["_dlq_reason"] == "handler_failed"
    assert "_owner" not in letter
    assert "_error" not in letter


def test_an_assignment_dead_letter_carries_its_origin() -> None:
    meta = dict(
        assignment_meta(
            DeadLetterReason.MAX_RETRIES_EXCEEDED,
            retry_count=4,
            assignment_stream="streamjobs:{svc}:lbs",
            assignment_id="5-0",
            owner="c2",
            error="x" * (ERROR_MAX_CHARS + 10),
        )
    )
    record = parse_dead_letter("6-0", {"stream": "call:1", "info": "{}", **meta})
    assert record.reason is DeadLetterReason.MAX_RETRIES_EXCEEDED
    assert record.is_assignment
    assert record.retry_count == 4
    assert len(record.error) == ERROR_MAX_CHARS
    assert record.fields == {"stream": "call:1", "info": "{}"}
    assert RETRY_FIELD in META_FIELDS


@given(st.dictionaries(st.sampled_from([*META_FIELDS, "n"]), values, max_size=8))
def test_parsing_never_raises(fields: dict[str, str]) -> None:
    record = parse_dead_letter("1-0", fields)
    assert record.reason is None or isinstance(record.reason, DeadLetterReason)
    assert record.retry_count >= 0
