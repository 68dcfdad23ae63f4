from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from redis.crc import key_slot as redis_key_slot

from streamjobs import ConfigurationError, InvalidStreamName
from streamjobs._keys import Keys, check_stream_name, hash_tag, key_slot

KEYS = Keys("svc")


def slot(key: str) -> int:
    return int(redis_key_slot(key.encode("utf-8")))


names = st.text(alphabet=st.sampled_from("ab{}:x -_é\n"), min_size=0, max_size=12) | st.text(
    max_size=20
)


@given(names)
def test_lock_is_in_the_streams_slot_or_the_name_is_rejected(name: str) -> None:
    try:
        lock = KEYS.lock(name)
    except InvalidStreamName:
        # Rejected names are exactly those with no co-located lock we can build.
        assert not name or ("}" in name and hash_tag(name) is None) or _not_utf8(name)
        return
    assert slot(lock) == slot(name)
    assert key_slot(lock) == key_slot(name)
    assert KEYS.stream_of_lock(lock) == name


def _not_utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


@given(names, names)
def test_distinct_streams_get_distinct_locks(a: str, b: str) -> None:
    try:
        la, lb = KEYS.lock(a), KEYS.lock(b)
    except InvalidStreamName:
        return
    assert (la == lb) == (a == b)


def test_examples() -> None:
    assert KEYS.assignments == "streamjobs:{svc}:lbs"
    assert KEYS.dead_letters == "streamjobs:{svc}:dlq"
    assert slot(KEYS.assignments) == slot(KEYS.dead_letters) == slot(KEYS.leases)
    assert KEYS.lock("call:42") == "streamjobs:lock:{call:42}"
    assert KEYS.lock("{tenant}:call:42") == "streamjobs:lock:t:{tenant}:call:42"
    assert KEYS.lock("{x}") != KEYS.lock("x")
    assert KEYS.stream_of_lock("other:key") is None


@pytest.mark.parametrize("bad", ["", "a}b", "a{}b}", "}", "x" * 1025, "é" * 513])
def test_rejected_names(bad: str) -> None:
    with pytest.raises(InvalidStreamName) as info:
        check_stream_name(bad)
    assert len(str(info.value)) < 400, "the error quotes the whole name"


def test_the_longest_name_is_1024_bytes() -> None:
    check_stream_name("x" * 1024)


@pytest.mark.parametrize(
    ("field", "value"), [("service", "a{b"), ("service", ""), ("prefix", "x y")]
)
def test_bad_service_or_prefix(field: str, value: str) -> None:
    kwargs = {"service": "ok", "prefix": "ok", field: value}
    with pytest.raises(ConfigurationError) as info:
        Keys(**kwargs)
    assert info.value.field == field


# -- a custom dead-letter stream name (RecoveryConfig.dlq_stream) ----------------------------


@given(names)
def test_a_dlq_name_is_accepted_exactly_when_it_shares_the_assignment_streams_slot(
    name: str,
) -> None:
    bad = (
        not name
        or _not_utf8(name)
        or name in (KEYS.assignments, KEYS.leases)
        or slot(name) != slot(KEYS.assignments)
    )
    if bad:
        with pytest.raises(ConfigurationError) as info:
            KEYS.check_dlq_name(name)
        assert info.value.field == "dlq_stream"
    else:
        KEYS.check_dlq_name(name)


@pytest.mark.parametrize(
    "name", ["streamjobs:{svc}:dlq", "streamjobs:{svc}:dead", "{svc}", "other:{svc}:x{y}"]
)
def test_a_dlq_name_with_the_service_tag_is_accepted(name: str) -> None:
    KEYS.check_dlq_name(name)


@pytest.mark.parametrize(
    "name", ["dead-letters", "streamjobs:svc:dlq", "x:{y}{svc}", "{svc", "{}{svc}"]
)
def test_a_dlq_name_in_another_slot_is_rejected_with_the_rule(name: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        KEYS.check_dlq_name(name)
    assert info.value.field == "dlq_stream"
    assert "{svc}" in info.value.rule
    assert "slot" in info.value.rule


def test_a_dlq_name_in_the_same_slot_by_chance_is_accepted() -> None:
    target = slot(KEYS.assignments)
    name = next(n for n in (f"dlq-{i}" for i in range(200_000)) if slot(n) == target)
    KEYS.check_dlq_name(name)


@pytest.mark.parametrize("name", [KEYS.assignments, KEYS.leases])
def test_the_dlq_cannot_be_the_assignment_stream_or_the_lease_index(name: str) -> None:
    with pytest.raises(ConfigurationError, match="dlq_stream"):
        KEYS.check_dlq_name(name)


@pytest.mark.parametrize("name", [KEYS.active, KEYS.idempotency("req-1")])
def test_the_dlq_cannot_be_an_index_or_an_idempotency_key(name: str) -> None:
    with pytest.raises(ConfigurationError, match="dlq_stream"):
        KEYS.check_dlq_name(name)


@given(st.text(max_size=30) | st.text(alphabet="{}:ab \t\n\x00é", max_size=12))
def test_an_idempotency_key_is_in_the_assignment_streams_slot_or_refused(key: str) -> None:
    """add.lua writes the key in the same script as the assignment and the index."""
    try:
        name = KEYS.idempotency(key)
    except ConfigurationError as exc:
        refused: ConfigurationError | None = exc
    else:
        refused = None
    if refused is not None:
        assert refused.field == "idempotency_key"
        return
    assert name == f"streamjobs:{{svc}}:idem:{key}"
    assert slot(name) == slot(KEYS.assignments) == slot(KEYS.active)


@pytest.mark.parametrize("key", ["", "\ud800", 5, b"k", None])
def test_bad_idempotency_keys_are_refused(key: object) -> None:
    with pytest.raises(ConfigurationError) as info:
        KEYS.idempotency(key)
    assert info.value.field == "idempotency_key"
