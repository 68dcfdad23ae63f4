"""What :mod:`streamjobs.dlq` takes and gives: the dead-letter filter, and the
report of a replay."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from ._deadletter import DeadLetterRecord
from ._dlq_reason import DeadLetterReason
from .exceptions import ConfigurationError

Progress = Callable[[int, int], None]
"""Called with (done, total) as a replay or purge goes."""


@dataclass(frozen=True, slots=True)
class DeadLetterFilter:
    """Which dead letters: every condition given must hold.

    Attributes:
        reason: a :class:`DeadLetterReason` (or its value), or any other text: the
            reason a handler gave with ``DeadLetter(reason=...)``, matched exactly
            against :attr:`DeadLetterRecord.rejected`.
        source_stream: the stream it came from (the assignment stream for assignments).
        older_than_s: dead-lettered at least this long ago.
        newer_than_s: dead-lettered at most this long ago.
        limit: at most this many (the oldest first).

    Raises:
        ConfigurationError: a bad value, naming the field.
    """

    reason: DeadLetterReason | str | None = None
    source_stream: str | None = None
    older_than_s: float | None = None
    newer_than_s: float | None = None
    limit: int | None = None

    def __post_init__(self) -> None:
        if self.reason is not None and not isinstance(self.reason, DeadLetterReason):
            if not isinstance(self.reason, str) or not self.reason:
                known = ", ".join(r.value for r in DeadLetterReason)
                raise ConfigurationError(
                    "reason",
                    f"must be one of {known}, or a handler's DeadLetter reason (a "
                    f"non-empty str), got {self.reason!r}",
                )
            with contextlib.suppress(ValueError):  # else: a handler's own text
                object.__setattr__(self, "reason", DeadLetterReason(self.reason))
        for name in ("older_than_s", "newer_than_s"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or value < 0
            ):
                raise ConfigurationError(name, f"must be a number of seconds >= 0, got {value!r}")
        if self.limit is not None and (
            isinstance(self.limit, bool) or not isinstance(self.limit, int) or self.limit < 1
        ):
            raise ConfigurationError("limit", f"must be an int >= 1, got {self.limit!r}")

    def matches(self, record: DeadLetterRecord) -> bool:
        if isinstance(self.reason, DeadLetterReason):
            if record.reason is not self.reason:
                return False
        elif self.reason is not None and (
            record.reason is not DeadLetterReason.REJECTED or record.rejected != self.reason
        ):
            return False
        return self.source_stream is None or record.source_stream == self.source_stream


@dataclass(frozen=True, slots=True)
class Replayed:
    dead_letter_id: str
    new_id: str
    """The id of the re-added assignment, or of the re-appended data entry."""
    target: str
    """Where it went: the assignment stream, or the data stream."""
    reassigned: bool = False
    """A data entry whose stream had finished: its stream got a new assignment."""


@dataclass(frozen=True, slots=True)
class ReplayReport:
    replayed: list[Replayed] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    """(dead letter id, why): gone already, or it cannot be put back."""
    dry_run: bool = False


def _check_id(entry_id: str) -> None:
    ms, sep, seq = entry_id.partition("-")
    if not (ms.isdigit() and (not sep or seq.isdigit())):
        raise ConfigurationError(
            "id", f"{entry_id!r} is not a stream entry id (like 1700000000000-0)"
        )
