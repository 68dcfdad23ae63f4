"""The value handed to ``StreamConsumer.handle()``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from ._wire import REPLAYED_FROM_FIELD


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

    @property
    def replayed_from(self) -> str | None:
        """For an entry put back by a dead-letter replay (``DeadLetters.replay``,
        ``streamjobs dlq replay``): the id it had in this stream when it was first
        dead-lettered, the same across repeated replays; None for any other entry. Key
        a handler's idempotency on ``message.replayed_from or message.id``. (It is also
        in ``fields``, as ``_replayed_from``.)"""
        return self.fields.get(REPLAYED_FROM_FIELD)
