"""Reply decoding: the shapes of stream entries, and what a read's reply (raw or parsed
by redis-py, RESP2 or RESP3) decodes to: entries as text or, in bytes mode, as bytes,
with the largest one's size; the fenced read's :class:`ReadReply`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

RawFields = dict[str, bytes | str]
Entry = tuple[str, dict[str, str]]
RawEntry = tuple[str, dict[bytes, bytes]]
"""An entry as a consumer in bytes mode gets it: its fields undecoded."""
DataEntry = tuple[str, dict[Any, Any]]
"""A data-stream entry read for ``handle()``: an :data:`Entry`, or in bytes mode
(``Gateway.raw_fields``) a :data:`RawEntry`."""


def id_order(entry_id: str) -> tuple[int, int]:
    """A stream entry id as a sortable pair ((0, 0) if it is not one)."""
    ms, _, seq = entry_id.partition("-")
    try:
        return int(ms), int(seq or 0)
    except ValueError:
        return 0, 0


def text(value: bytes | str | int) -> str:
    """A reply value as str (clients may or may not decode responses)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    return str(value)


class ReadReply(NamedTuple):
    """What one fenced read of a data stream returned."""

    owned: bool
    """The token held the lock (False: nothing was acked or read)."""
    top: str
    """When nothing was read: the newest id the group has seen, to wait for a newer one."""
    entries: list[DataEntry]
    largest_bytes: int = 0
    """Size of the largest entry read (its field names and values), in bytes."""
    claimed: bool = False
    """The entries came from the pending list: more may be pending, so the next read
    should claim first (``fenced_read(claim=True)``)."""
    cancelled: str | None = None
    """The stream was cancelled (``Producer.cancel_stream``), for this reason: hand
    nothing more to ``handle()`` and end it."""


NOT_OWNED = ReadReply(False, "", [])


def _size(value: Any) -> int:
    return len(value) if isinstance(value, bytes | str) else len(str(value))


def _decoded(body: Any) -> tuple[dict[str, str], int]:
    """One entry's fields, decoded, and their size in bytes (the hot paths: a raw reply
    of bytes, or one redis-py parsed into a dict; anything else takes the general path)."""
    if type(body) is list:  # a raw reply: [field, value, field, value, ...]
        try:
            # bytes.decode without arguments is CPython's fastest UTF-8 path; a value
            # that is not UTF-8 (or not bytes) takes the general path below.
            values = iter(map(bytes.decode, body))
            return dict(zip(values, values, strict=True)), sum(map(len, body))
        except (TypeError, ValueError):  # UnicodeDecodeError is a ValueError
            pass
    elif type(body) is dict:
        try:
            fields = {
                k.decode("utf-8", "surrogateescape"): v.decode("utf-8", "surrogateescape")
                for k, v in body.items()
            }
            return fields, sum(map(len, body)) + sum(map(len, body.values()))
        except AttributeError:  # not bytes
            pass
    pairs = (
        list(body.items())
        if isinstance(body, Mapping)
        else [(body[i], body[i + 1]) for i in range(0, len(body), 2)]
    )
    return {text(k): text(v) for k, v in pairs}, sum(_size(k) + _size(v) for k, v in pairs)


def sized_entries(raw_entries: Sequence[Any] | None) -> tuple[list[Entry], int]:
    """Decode stream entries as redis-py parsed them (``(id, {field: value})`` pairs,
    or flat ``[f, v, ...]`` lists) and measure the largest one in bytes."""
    out: list[Entry] = []
    append = out.append
    largest = 0
    decode = bytes.decode
    for item in raw_entries or ():
        if not item or item[1] is None:  # an entry deleted after it was claimed
            continue
        entry_id, body = item
        if type(body) is list and type(entry_id) is bytes and not len(body) & 1:
            # The hot path, inlined: a raw reply of bytes. bytes.decode without
            # arguments is CPython's fastest UTF-8 path; a value that is not UTF-8
            # takes the general path.
            try:
                values = iter(map(decode, body))
                fields = dict(zip(values, values, strict=False))  # length checked above
            except (TypeError, ValueError):  # UnicodeDecodeError is a ValueError
                fields, size = _decoded(body)
            else:
                size = sum(map(len, body))
            append((decode(entry_id), fields))
        else:
            fields, size = _decoded(body)
            append((text(entry_id), fields))
        if size > largest:
            largest = size
    return out, largest


def _as_bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    return str(value).encode("utf-8", "surrogateescape")


def raw_sized_entries(raw_entries: Sequence[Any] | None) -> tuple[list[RawEntry], int]:
    """:func:`sized_entries` for a consumer in bytes mode: the fields stay bytes (only
    the id is decoded), and the largest entry is measured the same way."""
    out: list[RawEntry] = []
    append = out.append
    largest = 0
    for item in raw_entries or ():
        if not item or item[1] is None:  # an entry deleted after it was claimed
            continue
        entry_id, body = item
        if type(body) is list and not len(body) & 1 and (not body or type(body[0]) is bytes):
            # The hot path: a raw reply, all bytes (the client does not decode: see
            # consumer._check_client).
            values = iter(body)
            fields: dict[bytes, bytes] = dict(zip(values, values, strict=False))
            size = sum(map(len, body))
        else:
            if isinstance(body, Mapping):
                pairs = list(body.items())
            else:
                pairs = [(body[i], body[i + 1]) for i in range(0, len(body) - 1, 2)]
            fields = {_as_bytes(k): _as_bytes(v) for k, v in pairs}
            size = sum(map(len, fields)) + sum(map(len, fields.values()))
        append((entry_id.decode() if type(entry_id) is bytes else str(entry_id), fields))
        if size > largest:
            largest = size
    return out, largest


def text_fields(fields: Mapping[Any, Any]) -> dict[str, str]:
    """An entry's fields as text, whichever mode read them: bytes are decoded with
    ``surrogateescape`` (so :func:`raw` gives them back exactly)."""
    return {text(k): text(v) for k, v in fields.items()}


def _stream_entries(reply: Any) -> Sequence[Any]:
    """The entries of an XREADGROUP reply for one stream, RESP2 or RESP3 shaped."""
    if not reply:
        return ()
    batches = list(reply.values()) if isinstance(reply, dict) else [r[1] for r in reply]
    batch = batches[0]
    if batch and isinstance(batch[0], list) and not isinstance(batch[0][0], bytes | str):
        batch = batch[0]  # RESP3 nests one level deeper
    return batch  # type: ignore[no-any-return]


def raw(values: Sequence[str]) -> list[bytes]:
    """Strings that may have come from :func:`text` as the bytes they were decoded from.

    Data-entry fields reach ``handle()`` decoded with ``surrogateescape``; a dead letter
    must write those exact bytes back (redis-py's encoder would refuse the surrogates).
    """
    return [v.encode("utf-8", "surrogateescape") for v in values]


def _raw_fields(fields: Mapping[Any, Any] | None) -> RawFields:
    return {text(k): v for k, v in (fields or {}).items()}
