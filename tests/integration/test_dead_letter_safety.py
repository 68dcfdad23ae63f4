"""No script acks an entry without writing its copy (docs/design.md#wire-format).

Redis does not roll a Lua script back: whatever can fail must fail before the first
write. These tests put the scripts in the situations where a late write used to fail
(an entry too large for Lua's ``unpack``, a dead-letter key of another type) and check
that the entry is either moved whole or left where it was.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis as AsyncRedis

from streamjobs import (
    ConsumerConfig,
    DeadLetter,
    DeadLetterReason,
    Message,
    Producer,
    RecoveryConfig,
    RequeueOutcome,
    ScriptError,
    WrongKeyType,
)
from streamjobs._deadletter import (
    assignment_meta,
    entry_dead_letter,
    parse_dead_letter,
)
from streamjobs._keys import Keys
from streamjobs._redis import Gateway, sized_entries
from tests.harness.plugin import ConsumerFactory

from ._helpers import Recorder, eventually

pytestmark = pytest.mark.anyio

OVERSIZED = 4_100
"""Fields of an entry beyond what one Lua ``unpack`` can pass to XADD (about 4,000)."""
CARRIER = "_fields_json"
"""``_deadletter.FIELDS_JSON_FIELD``, spelled out so this module imports on old code."""


def wide(count: int, /, **first: str) -> dict[str, str]:
    """``first`` plus filler fields up to ``count`` fields in all."""
    fields = dict(first)
    fields.update({f"f{i:05d}": f"v{i}" for i in range(count - len(first))})
    return fields


async def strand(redis: Any, keys: Keys, fields: Mapping[Any, Any], ghost: str = "ghost") -> str:
    """Add one assignment and have a consumer that then 'dies' read it (no lock)."""
    await Gateway(redis, keys).assignments.ensure_group()
    await redis.xadd(keys.assignments, fields)
    reply: Any = await redis.xreadgroup(keys.group, ghost, {keys.assignments: ">"}, count=1)
    [[_, [(entry_id, _)]]] = reply
    return str(entry_id.decode())


async def pending(redis: Any, keys: Keys) -> int:
    return int((await redis.xpending(keys.assignments, keys.group))["pending"])


async def dead_letters(redis: Any, dlq: str) -> list[Any]:
    """The DLQ's entries, parsed (decoded as the consumer decodes replies)."""
    raw = await redis.xrange(dlq)
    return [parse_dead_letter(i, f) for i, f in sized_entries([(i, _flat(f)) for i, f in raw])[0]]


def _flat(fields: dict[bytes, bytes]) -> list[bytes]:
    return [x for pair in fields.items() for x in pair]


def meta_for(keys: Keys, entry_id: str) -> list[tuple[str, str]]:
    return assignment_meta(
        DeadLetterReason.UNPARSEABLE,
        retry_count=0,
        assignment_stream=keys.assignments,
        assignment_id=entry_id,
        owner="ghost",
        error="InvalidAssignment: test",
    )


# -- 1. assignments too large to copy field by field -------------------------------------


async def test_requeue_refuses_an_oversized_assignment_before_writing(
    redis: AsyncRedis, service: str, uid: str
) -> None:
    """Before: XACK, then XADD failed in ``unpack``: acked, never copied, lost."""
    keys = Keys(service)
    aid = await strand(redis, keys, wide(OVERSIZED, stream=f"d:{uid}", info="{}"))
    await redis.zadd(keys.leases, {aid: 1})
    with pytest.raises(ScriptError):
        await Gateway(redis, keys).assignments.requeue(aid, 1)
    assert await pending(redis, keys) == 1, "the assignment must stay pending"
    assert await redis.xlen(keys.assignments) == 1
    assert await redis.zscore(keys.leases, aid) == 1, "nothing is written before the check"


async def test_recovery_dead_letters_an_oversized_assignment_whole(
    redis: AsyncRedis, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    """Before: ``claim`` raised ScriptError and the assignment was gone from every list."""
    keys = Keys(service)
    fields = wide(OVERSIZED, stream=f"d:{uid}", info='{"k": 1}', _retry_count="1")
    aid = await strand(redis, keys, fields)
    c = consumer_factory(Recorder, recovery=RecoveryConfig(max_retries=3))
    assert await c.claim(aid) is RequeueOutcome.DEAD_LETTERED
    assert await pending(redis, keys) == 0
    assert await redis.xlen(keys.assignments) == 0
    [record] = await dead_letters(redis, keys.dead_letters)
    assert record.reason is DeadLetterReason.TOO_LARGE
    assert (record.source_stream, record.source_id, record.owner) == (
        keys.assignments,
        aid,
        "ghost",
    )
    assert record.retry_count == 2, "the count the failed re-queue would have written"
    assert str(OVERSIZED) in record.error
    assert record.fields == {k: v for k, v in fields.items() if k != "_retry_count"}
    raw = await redis.xrange(keys.dead_letters)
    assert len(raw[0][1]) < 20, "carried in one JSON field, not field by field"


async def test_an_oversized_assignment_handed_back_at_shutdown_is_dead_lettered_whole(
    redis: AsyncRedis, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    """The hand-back's re-queue is refused without writing, so the lock is left to
    expire, and recovery then dead-letters the assignment (nothing is lost)."""
    keys = Keys(service)
    stream = f"d:{uid}"
    fast = ConsumerConfig(lock_ttl_s=1, read_block_ms=50)
    recovery = RecoveryConfig(min_idle_s=1.5, interval_s=0.5, lease_check_interval_s=0.2)
    fields = wide(OVERSIZED, stream=stream, info="{}")
    first = consumer_factory(Recorder, config=fast, recovery=recovery)
    async with first:
        await Producer(redis, service=service).append(stream, {"n": "0"})
        await redis.xadd(keys.assignments, fields)

        async def handled() -> bool:
            return len(first.handled) == 1

        await eventually(handled)
    second = consumer_factory(Recorder, config=fast, recovery=recovery)
    async with second:

        async def dead() -> bool:
            return bool(await redis.xlen(keys.dead_letters))

        await eventually(dead, timeout_s=15)
    [record] = await dead_letters(redis, keys.dead_letters)
    assert record.reason is DeadLetterReason.TOO_LARGE
    assert record.fields == fields
    assert await pending(redis, keys) == 0
    assert await redis.xlen(keys.assignments) == 0


async def test_an_oversized_unparseable_assignment_is_dead_lettered_whole(
    redis: AsyncRedis, service: str
) -> None:
    """Before: the dead-letter script acked, then failed in ``unpack``: lost."""
    keys = Keys(service)
    fields = wide(OVERSIZED, info="{}")  # no stream: unparseable
    aid = await strand(redis, keys, fields)
    await redis.zadd(keys.leases, {aid: 1})
    moved = await Gateway(redis, keys).assignments.dead_letter_assignment(aid, meta_for(keys, aid))
    assert moved is not None
    assert await pending(redis, keys) == 0
    assert await redis.xlen(keys.assignments) == 0
    assert await redis.zcard(keys.leases) == 0
    [record] = await dead_letters(redis, keys.dead_letters)
    assert record.id == moved[0]
    assert record.reason is DeadLetterReason.UNPARSEABLE
    assert record.is_assignment
    assert record.fields == fields
    assert record.dead_at_ms is not None


# -- 2. a dead-letter key of another type ---------------------------------------------------


async def test_dead_lettering_into_a_wrong_type_key_leaves_the_assignment_pending(
    redis: AsyncRedis, service: str
) -> None:
    """Before: XACK, then XADD answered WRONGTYPE: acked, never copied, lost."""
    keys = Keys(service)
    aid = await strand(redis, keys, {"info": "{}"})
    await redis.zadd(keys.leases, {aid: 1})
    await redis.set(keys.dead_letters, "not a stream")
    with pytest.raises(WrongKeyType):
        await Gateway(redis, keys).assignments.dead_letter_assignment(aid, meta_for(keys, aid))
    assert await pending(redis, keys) == 1
    assert await redis.xlen(keys.assignments) == 1
    assert await redis.zscore(keys.leases, aid) == 1
    assert await redis.get(keys.dead_letters) == b"not a stream"


async def test_recovery_keeps_retrying_while_the_dlq_key_has_the_wrong_type(
    redis: AsyncRedis, service: str, consumer_factory: ConsumerFactory
) -> None:
    keys = Keys(service)
    aid = await strand(redis, keys, {"info": "{}"})
    await redis.set(keys.dead_letters, "not a stream")
    c = consumer_factory(Recorder)
    with pytest.raises(WrongKeyType):
        await c.claim(aid)
    assert await pending(redis, keys) == 1
    await redis.delete(keys.dead_letters)  # the operator fixes it: the next try works
    assert await c.claim(aid) is RequeueOutcome.DEAD_LETTERED
    [record] = await dead_letters(redis, keys.dead_letters)
    assert record.fields == {"info": "{}"}


async def test_a_data_entry_dead_letter_into_a_wrong_type_key_writes_nothing(
    redis: AsyncRedis, service: str
) -> None:
    keys = Keys(service)
    await redis.set(keys.dead_letters, "not a stream")
    letter = entry_dead_letter(
        {"n": "1"}, stream="s", entry_id="1-1", retry_count=0, attempts=1, owner="c", error="e"
    )
    with pytest.raises(WrongKeyType):
        await Gateway(redis, keys).assignments.dead_letter_entry(letter)
    assert await redis.get(keys.dead_letters) == b"not a stream"


async def test_requeue_on_a_wrong_type_assignment_key_writes_nothing(
    redis: AsyncRedis, service: str
) -> None:
    """The assignment stream cannot hold another type while an entry is pending in it,
    so nothing is lost either way; the script still fails before its first write
    (before: its ZREM of the lease member ran, then XACK answered WRONGTYPE)."""
    keys = Keys(service)
    await redis.set(keys.assignments, "not a stream")
    await redis.zadd(keys.leases, {"1-1": 1})
    with pytest.raises(WrongKeyType):
        await Gateway(redis, keys).assignments.requeue("1-1", 1)
    assert await redis.zscore(keys.leases, "1-1") == 1


# -- 3. data entries too large to copy field by field -------------------------------------


async def test_an_oversized_data_entry_dead_letter_is_written_whole(
    redis: AsyncRedis, service: str
) -> None:
    """Before: ScriptError on every try, so its stream could never move on."""
    keys = Keys(service)
    fields = wide(OVERSIZED, n="big")
    letter = entry_dead_letter(
        fields, stream="s", entry_id="1-1", retry_count=2, attempts=3, owner="c", error="E: x"
    )
    dlq_id, trimmed = await Gateway(redis, keys).assignments.dead_letter_entry(letter)
    assert trimmed == 0
    [record] = await dead_letters(redis, keys.dead_letters)
    assert record.id == dlq_id
    assert record.reason is DeadLetterReason.HANDLER_FAILED
    assert (record.source_stream, record.source_id, record.retry_count) == ("s", "1-1", 2)
    assert (record.attempts, record.owner, record.error) == (3, "c", "E: x")
    assert record.fields == fields


class DeadLettersBig(Recorder):
    async def handle(self, message: Message) -> None:
        if message.fields.get("n") == "big":
            raise DeadLetter("too big to handle")
        await super().handle(message)


async def test_a_failing_oversized_data_entry_is_dead_lettered_and_the_stream_goes_on(
    redis: AsyncRedis, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    """Before: the dead letter failed forever, and the stream was stuck on the entry."""
    keys = Keys(service)
    stream = f"d:{uid}"
    producer = Producer(redis, service=service)
    fields = wide(OVERSIZED, n="big")
    c = consumer_factory(DeadLettersBig, config=ConsumerConfig(lock_ttl_s=2, read_block_ms=50))
    async with c:
        await producer.add_stream(stream)
        await producer.append(stream, {"n": "0"})
        big_id = await producer.append(stream, fields)
        await producer.append(stream, {"n": "1"})
        await producer.close_stream(stream)

        async def ended() -> bool:
            return stream in c.ended

        await eventually(ended, timeout_s=15)
    assert [n for _, _, _, n in c.handled] == ["0", "1"]
    [record] = await dead_letters(redis, keys.dead_letters)
    assert (record.source_stream, record.source_id) == (stream, big_id)
    assert record.error == "DeadLetter: too big to handle"
    assert record.fields == fields


async def test_a_failing_entry_with_non_utf8_bytes_is_dead_lettered_byte_for_byte(
    redis: AsyncRedis, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    """``handle()`` gets non-UTF-8 bytes decoded with surrogateescape; its dead letter
    must write the same bytes back (before: redis-py refused to encode the surrogates,
    so the dead letter never got written and the stream was stuck)."""
    keys = Keys(service)
    stream = f"d:{uid}"
    producer = Producer(redis, service=service)
    c = consumer_factory(DeadLettersBig, config=ConsumerConfig(lock_ttl_s=2, read_block_ms=50))
    async with c:
        await producer.add_stream(stream)
        await redis.xadd(stream, {"n": "big", "raw": b"\xff\xfe\x00ok", b"\xc3": b"\x80"})
        await producer.append(stream, {"n": "1"})
        await producer.close_stream(stream)

        async def ended() -> bool:
            return stream in c.ended

        await eventually(ended, timeout_s=15)
    assert [n for _, _, _, n in c.handled] == ["1"]
    [(_, letter)] = list(await redis.xrange(keys.dead_letters) or [])
    assert letter[b"raw"] == b"\xff\xfe\x00ok"
    assert letter[b"\xc3"] == b"\x80"


# -- 4. a custom dead-letter stream -----------------------------------------------------------


async def test_a_custom_dlq_with_the_service_tag_receives_dead_letters(
    redis: AsyncRedis, service: str, consumer_factory: ConsumerFactory
) -> None:
    """On a cluster too: the name the configuration accepts is in the LBS's slot."""
    keys = Keys(service)
    dlq = f"app:{{{service}}}:dead"
    aid = await strand(redis, keys, wide(OVERSIZED, info="{}"))
    c = consumer_factory(Recorder, recovery=RecoveryConfig(dlq_stream=dlq))
    assert await c.claim(aid) is RequeueOutcome.DEAD_LETTERED
    [record] = await dead_letters(redis, dlq)
    assert record.reason is DeadLetterReason.UNPARSEABLE
    assert len(record.fields) == OVERSIZED
    assert await redis.exists(keys.dead_letters) == 0


# -- where the field-by-field form ends ----------------------------------------------------


async def test_the_largest_assignment_that_is_requeued_field_by_field(
    redis: AsyncRedis, service: str, uid: str
) -> None:
    from streamjobs._redis._scripts import MAX_COPY_VALUES

    keys = Keys(service)
    gw = Gateway(redis, keys)
    # A re-queue copies every field and adds _retry_count and _first_id.
    largest = MAX_COPY_VALUES // 2 - 2
    fields = wide(largest, stream=f"d:{uid}", info="{}")
    aid = await strand(redis, keys, fields)
    new_id = await gw.assignments.requeue(aid, 1)
    assert new_id is not None
    [(_, copy)] = list(await redis.xrange(keys.assignments) or [])
    assert len(copy) == largest + 2
    assert copy[b"_retry_count"] == b"1"
    assert copy[b"_first_id"] == aid.encode()
    await redis.delete(keys.assignments)

    aid = await strand(redis, keys, wide(largest + 1, stream=f"d:{uid}", info="{}"))
    with pytest.raises(ScriptError):
        await gw.assignments.requeue(aid, 1)
    assert await pending(redis, keys) == 1


@pytest.mark.parametrize("extra", [0, 1])
async def test_dead_letters_switch_to_the_json_form_exactly_past_the_limit(
    redis: AsyncRedis, service: str, extra: int
) -> None:
    from streamjobs._redis._scripts import MAX_COPY_VALUES

    keys = Keys(service)
    meta = meta_for(keys, "0-1")
    # Originals, metadata and _dead_at_ms, field by field, up to the limit.
    largest = MAX_COPY_VALUES // 2 - len(meta) - 1
    fields = wide(largest + extra, info="{}")
    aid = await strand(redis, keys, fields)
    assert await Gateway(redis, keys).assignments.dead_letter_assignment(aid, meta_for(keys, aid))
    [(_, raw)] = list(await redis.xrange(keys.dead_letters) or [])
    assert (CARRIER.encode() in raw) is bool(extra)
    [record] = await dead_letters(redis, keys.dead_letters)
    assert record.fields == fields


# -- the JSON form, as cjson writes it, read back by parse_dead_letter ----------------------

names = st.binary(min_size=1, max_size=8)
raw_values = st.binary(max_size=24)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    st.dictionaries(
        st.one_of(names, st.sampled_from([b"_fields_json", b"_owner", b"stream"])),
        raw_values,
        min_size=1,
        max_size=8,
    ),
    st.booleans(),
)
async def test_both_forms_written_by_the_scripts_parse_back_to_the_original_fields(
    redis: AsyncRedis, service: str, fields: dict[bytes, bytes], assignment: bool
) -> None:
    """Any bytes (control characters, quotes, slashes, non-UTF-8) survive cjson and
    parse back as the field-by-field form decodes them; the same entry dead-lettered
    in either form reads back the same."""
    from streamjobs._deadletter import META_FIELDS

    keys = Keys(service)
    decoded = {k.decode("utf-8", "surrogateescape"): v for k, v in fields.items()}
    expected = {
        k: v.decode("utf-8", "surrogateescape") for k, v in decoded.items() if k not in META_FIELDS
    }
    records = []
    for limit in (0, 10_000):  # every letter in the JSON form, then as few as possible
        gw = Gateway(redis, keys)
        gw.max_copy_values = limit
        if assignment:
            aid = await strand(redis, keys, fields)
            meta = [pair for pair in meta_for(keys, aid) if pair[0] != "_owner"]
            assert await gw.assignments.dead_letter_assignment(aid, meta)
        else:
            letter = entry_dead_letter(
                {k: v.decode("utf-8", "surrogateescape") for k, v in decoded.items()},
                stream="s",
                entry_id="1-1",
                retry_count=0,
                attempts=1,
                owner="c",
                error="e",
            )
            await gw.assignments.dead_letter_entry(letter)
        [record] = await dead_letters(redis, keys.dead_letters)
        records.append(record)
        # The same source entry again: its marker would make the second write a repeat.
        await redis.delete(
            keys.assignments, keys.dead_letters, keys.leases, keys.dead_marker("s", "1-1")
        )
    by_json, by_field = records
    assert by_json.fields == expected
    assert by_field.fields == expected
    assert (by_json.reason, by_json.source_stream) == (by_field.reason, by_field.source_stream)
