"""The value handed to ``StreamConsumer.handle()``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple


class Message(NamedTuple):
    """One data-stream entry, as handed to ``handle()``. Immutable.

    A named tuple rather than a frozen dataclass: one is built per entry on the hot
    path, and a frozen dataclass's ``__init__`` costs several times more.

    Attributes:
        stream: the data stream's name.
        id: the entry id (``"<ms>-<seq>"``).
        fields: the entry's fields. Values that are not valid UTF-8 are decoded with
            ``surrogateescape``; ``value.encode("utf-8", "surrogateescape")`` gives the
            original bytes back.
        info: the ``info`` object of the assignment that named this stream.
        attempt: 1 on the first call for this entry, 2 on the first retry, and so on.
    """

    stream: str
    id: str
    fields: Mapping[str, str]
    info: Mapping[str, Any]
    attempt: int = 1
