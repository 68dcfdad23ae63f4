"""The value handed to ``StreamConsumer.handle()``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Generic, NamedTuple

from typing_extensions import TypeVar

from ._wire import REPLAYED_FROM_FIELD

F = TypeVar("F", str, bytes, default=str)
"""The type of an entry's field names and values: ``str`` (the default) or ``bytes``
(a consumer declared as ``StreamConsumer[bytes]``: docs/concepts.md#bytes-mode)."""

_REPLAYED_FROM = REPLAYED_FROM_FIELD.encode()


class Message(NamedTuple, Generic[F]):
    """One data-stream entry, as handed to ``handle()``. Immutable.

    A named tuple rather than a frozen dataclass: one is built per entry on the hot
    path, and a frozen dataclass's ``__init__`` costs several times more.

    ``Message`` alone means ``Message[str]``. A consumer declared as
    ``StreamConsumer[bytes]`` gets ``Message[bytes]``: its fields are the bytes Redis
    holds, undecoded (docs/concepts.md#bytes-mode).

    Attributes:
        stream: the data stream's name.
        id: the entry id (``"<ms>-<seq>"``).
        fields: the entry's fields. As ``str`` (the default), values that are not
            valid UTF-8 are decoded with ``surrogateescape``;
            ``value.encode("utf-8", "surrogateescape")`` gives the original bytes
            back. As ``bytes``, names and values are exactly what was written.
        info: the ``info`` object of the assignment that named this stream.
        attempt: 1 on the first call for this entry, 2 on the first retry, and so on.
    """

    stream: str
    id: str
    fields: Mapping[F, F]
    info: Mapping[str, Any]
    attempt: int = 1

    @property
    def replayed_from(self) -> str | None:
        """For an entry put back by a dead-letter replay (``DeadLetters.replay``,
        ``streamjobs dlq replay``): the id it had in this stream when it was first
        dead-lettered, the same across repeated replays; None for any other entry. Key
        a handler's idempotency on ``message.replayed_from or message.id``. (It is also
        in ``fields``, as ``_replayed_from``.) Always ``str``, in bytes mode too."""
        fields: Mapping[Any, Any] = self.fields
        value = fields.get(REPLAYED_FROM_FIELD)
        if value is None:
            value = fields.get(_REPLAYED_FROM)
        if isinstance(value, bytes):
            return value.decode("utf-8", "surrogateescape")
        return value if value is None else str(value)
