"""The dead-letter format: what is built parses back, and parsing never raises."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from streamjobs import DeadLetterReason
from streamjobs._deadletter import (
    ATTEMPTS_FIELD,
    DEAD_AT_FIELD,
    ERROR_MAX_CHARS,
    FIELDS_JSON_FIELD,
    JOB_FIELD,
    META_FIELDS,
    Pairs,
    assignment_meta,
    entry_dead_letter,
    flatten,
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


# -- the JSON form of an oversized entry (docs/design.md#wire-format) ----------------------

any_names = st.one_of(field_names, st.sampled_from([*META_FIELDS, FIELDS_JSON_FIELD]))


def json_form(letter: Pairs) -> dict[str, str]:
    """``letter`` as the scripts write it past the size limit: the metadata as fields,
    the original fields in one JSON array."""
    meta = [(k, v) for k, v in letter if k in META_FIELDS]
    original = [(k, v) for k, v in letter if k not in META_FIELDS]
    return {**dict(meta), FIELDS_JSON_FIELD: json.dumps(flatten(original))}


@given(st.dictionaries(field_names, values, min_size=1, max_size=8), st.integers(1, 9))
def test_both_forms_of_a_data_entry_dead_letter_parse_the_same(
    fields: dict[str, str], attempts: int
) -> None:
    letter = entry_dead_letter(
        fields, stream="s", entry_id="1-1", retry_count=1, attempts=attempts, owner="c", error="e"
    )
    by_field = parse_dead_letter("9-0", {**dict(letter), DEAD_AT_FIELD: "5"})
    carried = parse_dead_letter("9-0", {**json_form(letter), DEAD_AT_FIELD: "5"})
    assert carried == by_field
    assert carried.fields == {k: v for k, v in fields.items() if k not in META_FIELDS}


@given(st.lists(st.tuples(any_names, values), max_size=10))
def test_json_carried_fields_parse_back_in_order_without_metadata(
    pairs: list[tuple[str, str]],
) -> None:
    """Whatever the original names (metadata names, ``_fields_json`` itself, repeats),
    the carried fields read back as the field-by-field decoding would: later repeats
    win and metadata names are not original fields (a dead assignment's ``_job`` is:
    a replay run's, which its replay carries again)."""
    meta = assignment_meta(
        DeadLetterReason.TOO_LARGE,
        retry_count=3,
        assignment_stream="P:{s}:lbs",
        assignment_id="1-0",
        owner="c",
    )
    letter = {**dict(meta), FIELDS_JSON_FIELD: json.dumps(flatten(pairs))}
    record = parse_dead_letter("2-0", letter)
    assert record.reason is DeadLetterReason.TOO_LARGE
    assert (record.retry_count, record.owner, record.source_id) == (3, "c", "1-0")
    expected = {k: v for k, v in pairs if k not in META_FIELDS or k == JOB_FIELD}
    assert list(record.fields.items()) == list(expected.items())


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | values,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(values, inner, max_size=4),
    max_leaves=12,
)


@given(
    st.one_of(values, json_values.map(json.dumps)),
    st.dictionaries(st.sampled_from([*META_FIELDS, "n"]), values, max_size=4),
)
def test_parsing_never_raises_on_any_carrier(carrier: str, others: dict[str, str]) -> None:
    """A ``_fields_json`` that is not a JSON array of an even number of strings is an
    ordinary field; one that is, is read as the carried fields."""
    record = parse_dead_letter("1-0", {**others, FIELDS_JSON_FIELD: carrier})
    try:
        decoded = json.loads(carrier)
    except ValueError:
        decoded = None
    is_form = decoded == {} or (
        isinstance(decoded, list)
        and len(decoded) % 2 == 0
        and all(isinstance(x, str) for x in decoded)
    )
    # A dead assignment (no _attempts) keeps _job among its original fields.
    meta = set(META_FIELDS) - ({JOB_FIELD} if ATTEMPTS_FIELD not in others else set())
    expected = {FIELDS_JSON_FIELD: carrier}
    if is_form:
        pairs = zip(decoded[::2], decoded[1::2], strict=True) if decoded else ()
        expected = {k: v for k, v in pairs if k not in meta}
    for beside in ("n", JOB_FIELD):
        if beside in others and beside not in meta:
            expected[beside] = others[beside]  # a field beside the carrier is kept
    assert record.fields == expected


def test_a_carrier_nested_too_deep_for_the_json_parser_is_an_ordinary_field() -> None:
    deep = "[" * 100_000 + "]" * 100_000
    record = parse_dead_letter("1-0", {FIELDS_JSON_FIELD: deep})
    assert record.fields == {FIELDS_JSON_FIELD: deep}


def test_a_handlers_reason_is_kept_and_found_by_its_text() -> None:
    from streamjobs import DeadLetterFilter
    from streamjobs._deadletter import entry_dead_letter as build

    letter = build(
        {"n": "1"},
        stream="s",
        entry_id="1-1",
        retry_count=0,
        attempts=1,
        owner="c",
        error="DeadLetter: invalid order",
        rejected="invalid order",
    )
    record = parse_dead_letter("9-9", dict(letter))
    assert record.reason is DeadLetterReason.REJECTED
    assert record.rejected == "invalid order"
    assert record.fields == {"n": "1"}
    assert DeadLetterFilter(reason="invalid order").matches(record)
    assert DeadLetterFilter(reason="rejected").matches(record)
    assert not DeadLetterFilter(reason="other text").matches(record)
    assert not DeadLetterFilter(reason="handler_failed").matches(record)
    failed = parse_dead_letter(
        "9-8",
        dict(
            build({}, stream="s", entry_id="1-2", retry_count=0, attempts=3, owner="c", error="e")
        ),
    )
    assert failed.reason is DeadLetterReason.HANDLER_FAILED
    assert not DeadLetterFilter(reason="invalid order").matches(failed)
