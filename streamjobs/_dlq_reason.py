"""Why an entry was dead-lettered: the values of its ``_dlq_reason`` field
(docs/design.md#wire-format), which are also the bounded label of the dead-letter
metrics."""

from __future__ import annotations

import enum


class DeadLetterReason(enum.Enum):
    """``_dlq_reason`` of a dead-letter entry."""

    MAX_RETRIES_EXCEEDED = "max_retries_exceeded"
    """An assignment whose owners died ``max_retries`` times (a poison stream)."""
    UNPARSEABLE = "unparseable"
    """An assignment entry that cannot be parsed."""
    HANDLER_FAILED = "handler_failed"
    """A data entry whose handler kept failing (``max_handler_attempts``)."""
    REJECTED = "rejected"
    """A data entry whose handler raised ``DeadLetter``; the reason it gave is in
    ``_rejected`` (:attr:`DeadLetterRecord.rejected`), findable with
    ``DeadLetterFilter(reason=<that text>)``. A fixed value, so metric labels stay
    bounded whatever the handlers say."""
    TOO_LARGE = "too_large"
    """An assignment to re-queue with too many fields for a script to copy."""
    UNUSABLE_STREAM = "unusable_stream"
    """An assignment whose data stream cannot be used (a key of another type, say)."""
    IDLE_TIMEOUT = "idle_timeout"
    """An assignment whose stream got no new entry for ``stream_idle_timeout_s``."""
    MANUAL = "manual"
    """Written by an operator."""
