"""Decoding of stream entries in every shape a reply takes: raw (the fenced read's
MULTI/EXEC goes below redis-py's parsers), parsed by redis-py, decoded or not."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from redis.asyncio.connection import Connection
from redis.exceptions import DataError

from streamjobs import StreamConsumer
from streamjobs._redis import _stream_entries, raw, sized_entries, text_fields
from streamjobs._redis._boundary import raw_sized_entries
from streamjobs._redis._channel import pack
from streamjobs.exceptions import ConfigurationError

RAW_RESP2: Any = [[b"s", [[b"1-0", [b"a", b"1", b"payload", b"xyz"]], [b"2-0", [b"b", b"22"]]]]]


def test_a_raw_resp2_reply_is_decoded_and_measured() -> None:
    entries, largest = sized_entries(_stream_entries(RAW_RESP2))
    assert entries == [("1-0", {"a": "1", "payload": "xyz"}), ("2-0", {"b": "22"})]
    assert largest == len(b"a1payloadxyz")


def test_a_raw_resp3_reply_is_decoded() -> None:
    reply = {b"s": [[b"1-0", [b"a", b"1"]]]}
    assert sized_entries(_stream_entries(reply))[0] == [("1-0", {"a": "1"})]


@pytest.mark.parametrize(
    "body",
    [
        [b"k", b"\xff\xfe"],  # not UTF-8: surrogateescape keeps the bytes
        {b"k": b"\xff\xfe"},
    ],
)
def test_bytes_that_are_not_utf8_survive_both_shapes(body: Any) -> None:
    [(_, fields)], largest = sized_entries([(b"1-0", body)])
    assert fields["k"].encode("utf-8", "surrogateescape") == b"\xff\xfe"
    assert largest == 3


@pytest.mark.parametrize("body", [["k", "v", "k2", "v2"], {"k": "v", "k2": "v2"}])
def test_a_decoding_client_s_str_replies_take_the_general_path(body: Any) -> None:
    assert sized_entries([("1-0", body)]) == ([("1-0", {"k": "v", "k2": "v2"})], 6)


def test_a_repeated_field_keeps_its_last_value_and_counts_every_byte() -> None:
    [(_, fields)], largest = sized_entries([(b"1-0", [b"k", b"1", b"k", b"22"])])
    assert fields == {"k": "22"}
    assert largest == 5


def test_an_entry_deleted_after_its_claim_is_skipped() -> None:
    assert sized_entries([(b"1-0", None), (b"2-0", [b"a", b"b"])])[0] == [("2-0", {"a": "b"})]


@pytest.mark.parametrize(
    "command",
    [
        ("EVALSHA", "a" * 40, 3, "k1", "k2", "k3", "tok", 30000, "", "1-0"),
        ("XADD", b"s", "*", b"\xff\x00bin", "caf\u00e9", 1.5, -7),
        ("PING",),
    ],
)
def test_the_channel_packs_commands_as_redis_py_does(command: tuple[Any, ...]) -> None:
    connection = Connection()
    expected = b"".join(connection.pack_command(*command))
    assert pack([command]) == expected
    assert pack([command, command]) == expected * 2


@pytest.mark.parametrize("bad", [True, None, object()])
def test_the_channel_refuses_what_redis_py_refuses(bad: Any) -> None:
    with pytest.raises(DataError):
        pack([("SET", "k", bad)])


# -- bytes mode (docs/concepts.md#bytes-mode) ------------------------------------------


@pytest.mark.parametrize(
    "reply",
    [
        RAW_RESP2,
        {b"s": [[b"1-0", [b"a", b"1", b"payload", b"xyz"]], [b"2-0", [b"b", b"22"]]]},
    ],
)
def test_bytes_mode_keeps_the_fields_and_measures_like_text_mode(reply: Any) -> None:
    entries, largest = raw_sized_entries(_stream_entries(reply))
    assert entries == [("1-0", {b"a": b"1", b"payload": b"xyz"}), ("2-0", {b"b": b"22"})]
    assert largest == sized_entries(_stream_entries(reply))[1]


@pytest.mark.parametrize(
    "body", [{b"k": b"\xff", b"n": b"1"}, ["k", "\udcff", "n", "1"], {"k": "\udcff", "n": 1}]
)
def test_bytes_mode_turns_any_parsed_shape_into_bytes(body: Any) -> None:
    [(entry_id, fields)], largest = raw_sized_entries([("1-0", body), (b"2-0", None)])
    assert (entry_id, fields, largest) == ("1-0", {b"k": b"\xff", b"n": b"1"}, 4)


@given(st.dictionaries(st.binary(min_size=1), st.binary(), min_size=1))
def test_text_fields_of_bytes_give_the_bytes_back(fields: dict[bytes, bytes]) -> None:
    text = text_fields(fields)
    assert dict(zip(raw(list(text)), raw(list(text.values())), strict=True)) == fields


def test_a_fields_type_other_than_str_or_bytes_is_refused_naming_it() -> None:
    with pytest.raises(ConfigurationError, match="fields_type"):

        class Odd(StreamConsumer):
            fields_type = int  # type: ignore[assignment]

            async def handle(self, message: Any) -> None: ...
