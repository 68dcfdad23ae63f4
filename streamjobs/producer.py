"""Producer: queue assignments and append to data streams."""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from typing import Any, Final

from . import _tracing
from ._keys import DEFAULT_PREFIX, Keys
from ._redis._gateway import Gateway
from ._wire import EOS_FIELD, EOS_VALUE, build_fields
from .exceptions import ConfigurationError

DEFAULT_DEDUPE_WINDOW_S: Final = 86_400.0
"""How long ``add_stream`` remembers an idempotency key by default (one day)."""

MAX_DEDUPE_WINDOW_S: Final = 1e9
"""The longest dedupe window ``add_stream`` accepts (about 31 years): a bound that
keeps the key's expiry time representable on the server."""


def _window_ms(dedupe_window_s: float) -> int:
    """``dedupe_window_s`` in whole milliseconds (rounded up).

    Raises:
        ConfigurationError: for field ``dedupe_window_s``: not a finite number of
            seconds above 0 and at most ``MAX_DEDUPE_WINDOW_S``.
    """
    if isinstance(dedupe_window_s, bool) or not isinstance(dedupe_window_s, int | float):
        raise ConfigurationError("dedupe_window_s", "must be a number of seconds")
    if not math.isfinite(dedupe_window_s) or not 0 < dedupe_window_s <= MAX_DEDUPE_WINDOW_S:
        raise ConfigurationError(
            "dedupe_window_s",
            f"must be above 0 and at most {MAX_DEDUPE_WINDOW_S:.0e} s, got {dedupe_window_s!r}",
        )
    return math.ceil(dedupe_window_s * 1000)


CANCEL_MARKER_TTL_MS: Final = 86_400_000
"""How long a cancel marker waits for an owner to see it (one day); the owner that
ends the stream deletes it, and so does a new :meth:`Producer.add_stream` of the name."""


class CancelOutcome(enum.Enum):
    """What :meth:`Producer.cancel_stream` did."""

    REMOVED = "removed"
    """The assignment was still queued: it is gone, no consumer will see it."""
    SIGNALLED = "signalled"
    """A consumer holds it (or will recover it): it ends the stream within a batch."""
    NOT_FOUND = "not_found"
    """No unfinished assignment of ``add_stream`` and no lock: nothing was done."""


class Producer:
    """Writes assignments and data entries for one service.

    Args:
        redis: a ``redis.asyncio.Redis`` or ``RedisCluster``; not closed by the producer.
        service: the service whose consumers process the streams.
        key_prefix: must match the consumers' ``ConsumerConfig.key_prefix``.

    Raises:
        ConfigurationError: an invalid service name or prefix.
    """

    def __init__(self, redis: Any, *, service: str, key_prefix: str = DEFAULT_PREFIX) -> None:
        self._keys = Keys(service, key_prefix)
        self._gw = Gateway(redis, self._keys)

    async def add_stream(
        self,
        name: str,
        info: Mapping[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
        dedupe_window_s: float = DEFAULT_DEDUPE_WINDOW_S,
    ) -> str:
        """Queue an assignment naming data stream ``name``; returns the assignment's id.

        Submission is idempotent while the job is unfinished: if ``name`` already has an
        assignment queued by ``add_stream`` that has not finished (not yet read, owned,
        or re-queued after a crash or a hand-back), nothing is queued and that
        assignment's id is returned; ``info`` is then ignored (the first submission's
        stays). The check and the write are one script on the assignment stream's slot
        (docs/design.md#submission). Once the stream has finished (or its assignment
        was dead-lettered), a new call queues a new job of the same name. Assignments
        written by other means (a raw XADD, the Go library's ``lbs-input`` form) are
        not deduplicated.

        A new job of a reused name reads only what is appended after this call began:
        what the previous job's producer appended after that job ended is skipped
        (docs/design.md#job-identity). Append the job's entries once this call has
        returned; if it raised, call it again first (pass an ``idempotency_key`` so that
        a repeat cannot start a second job): a failed call may have queued the job
        without skipping those leftovers yet.

        Args:
            name: the data stream.
            info: a JSON object handed to ``on_stream_start``.
            idempotency_key: names this submission: a repeat with the same key within
                ``dedupe_window_s`` returns the id the first one returned, even after
                that job has finished (a client retrying a call whose reply was lost
                never starts a second job). The key alone decides: a repeat's ``name``
                and ``info`` are not compared.
            dedupe_window_s: how long the key is remembered, from the first call.

        Raises:
            InvalidStreamName: ``name`` cannot be given a lock key in its own slot, or is
                reserved (it starts with the key prefix).
            TypeError: ``info`` is not JSON-serialisable.
            ConfigurationError: (a ``ValueError``) ``idempotency_key`` is not a non-empty
                UTF-8 str, or ``dedupe_window_s`` is not a finite number of seconds above
                0 (and at most ``MAX_DEDUPE_WINDOW_S``); ``field`` names the argument.
            WrongKeyType: the assignment stream, its index or the idempotency key
                holds another type (nothing was written).
        """
        self._keys.check_data_stream(name)
        fields = build_fields(name, info)
        window_ms = _window_ms(dedupe_window_s)
        if idempotency_key is not None:
            self._keys.idempotency(idempotency_key)  # validates it
        # If the previous job of the name ended, what was appended after its end
        # belongs to it: skipped now, so a new job reads only what comes after
        # (docs/design.md#job-identity). Before add.lua, so that no owner of the new
        # job can read it first.
        await self._gw.writes.start_job(name, "", created=False)
        assignment_id, created = await self._gw.writes.add_assignment(
            name, fields, idempotency_key=idempotency_key, window_ms=window_ms
        )
        if created:
            # A stream of this name that finished recently still carries its retention
            # TTL, which would expire this job's entries (the new owner clears it too):
            # cleared only when queued now, since a deduplicated call may name the
            # finished job.
            await self._gw.writes.start_job(name, assignment_id, created=True)
        return assignment_id

    async def append(self, name: str, fields: Mapping[str, str | bytes | int | float]) -> str:
        """Append one entry to data stream ``name``; returns its id.

        With an OpenTelemetry tracer provider configured and a span current, the W3C
        trace context is added as the ``traceparent`` (and ``tracestate``) fields,
        unless ``fields`` sets them itself; the consumer's span for this entry is its
        child (docs/operations.md#tracing).

        Raises:
            InvalidStreamName: see :meth:`add_stream`.
            ValueError: ``fields`` is empty or uses the reserved ``_eos`` field.
        """
        self._keys.check_data_stream(name)
        if not fields:
            raise ValueError("fields must not be empty")
        if EOS_FIELD in fields:
            raise ValueError(f"{EOS_FIELD!r} is reserved: use close_stream()")
        return await self._gw.writes.append(name, _tracing.inject(fields))

    async def cancel_stream(self, name: str, reason: str = "") -> CancelOutcome:
        """Stop the job of data stream ``name`` for good (docs/operations.md#cancelling-a-stream).

        An assignment queued by :meth:`add_stream` that no consumer has read yet is
        removed, and the stream's entries so far are skipped (the next job of the same
        name starts after them). One a consumer holds is ended by it at its next read or lock check
        (within about 50 ms, after the ``handle()`` call in progress): no more of its
        entries reach ``handle()``, what was delivered and not handled is acked, what
        was not read is skipped, the assignment completes, the lock is released and
        ``on_stream_cancelled(name, reason)`` is called. An owner that dies first
        leaves it to the consumer that recovers it, which ends it the same way. An
        owner that had already reached the stream's own end marker finishes it
        normally. The stream's entries are left where they are (the owner's retention
        applies).

        Returns:
            ``REMOVED``, ``SIGNALLED`` (its owner will end it, unless it was already
            ending), or ``NOT_FOUND`` (no unfinished assignment queued by
            ``add_stream``, and no lock: nothing done).

        Raises:
            InvalidStreamName: see :meth:`add_stream`.
        """
        self._keys.check_data_stream(name)
        outcome, _, job = await self._gw.writes.cancel_queued(name)
        if outcome == "removed":
            # Its entries stay in the stream (the retention applies): the next job of
            # the same name must start after them, not handle them, nor what its
            # producer appends later.
            await self._gw.writes.skip_unread(name, job)
            return CancelOutcome.REMOVED
        if outcome == "none" and not await self._gw.liveness.lock_exists(name):
            return CancelOutcome.NOT_FOUND
        # Moot (nothing written) if that job is over already: a marker would outlive it.
        await self._gw.writes.signal_cancel(name, reason, CANCEL_MARKER_TTL_MS, job)
        return CancelOutcome.SIGNALLED

    async def close_stream(self, name: str) -> str:
        """Append the end-of-stream marker; the owner finishes after it. Returns its id."""
        self._keys.check_data_stream(name)
        return await self._gw.writes.append(name, {EOS_FIELD: EOS_VALUE})
