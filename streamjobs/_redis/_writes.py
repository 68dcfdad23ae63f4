"""Producer writes: queueing a job, starting it, cancelling, appending."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._keys import Keys
from .._wire import (
    CANCEL_FIELD,
    EOS_FIELD,
    EOS_VALUE,
    FIRST_ID_FIELD,
)
from ..exceptions import (
    ConfigurationError,
)
from ._boundary import (
    ENDED_MARKER_TTL_MS,
    Core,
    script,
    translated,
)
from ._replies import (
    text,
)
from ._scripts import Scripts


class ProducerCommands:
    """Producer writes: queueing a job, starting it, cancelling, appending."""

    def __init__(self, core: Core) -> None:
        self.core = core
        self.client: Any = core.client
        self.keys: Keys = core.keys
        self.scripts: Scripts = core.scripts

    # -- producer writes -----------------------------------------------------------

    @script
    async def add_assignment(
        self,
        stream: str,
        fields: Mapping[str, str],
        *,
        idempotency_key: str | None = None,
        window_ms: int = 0,
    ) -> tuple[str, bool]:
        """Queue an assignment for data stream ``stream`` unless one is unfinished
        (``add.lua``, docs/design.md#submission).

        Args:
            stream: the data stream, the name ``fields`` carry.
            fields: the new assignment's fields.
            idempotency_key: if given, a repeat within ``window_ms`` returns the id this
                call returns, even once that job has finished.
            window_ms: how long the idempotency key is kept; above 0 with a key
                (``ConfigurationError`` otherwise: the script's last write would fail).

        Returns:
            (assignment id, True if it was queued by this call).

        Raises:
            WrongKeyType: the assignment stream, the index or the idempotency key holds
                another type; nothing was written.
        """
        keys = [self.keys.assignments, self.keys.active]
        if idempotency_key is not None:
            if window_ms <= 0:  # SET PX would fail after the XADD: refuse it up front
                raise ConfigurationError("window_ms", f"must be above 0 with a key: {window_ms}")
            keys.append(self.keys.idempotency(idempotency_key))
        flat = [part for pair in fields.items() for part in pair]
        r = await self.scripts.add(keys=keys, args=[stream, window_ms, *flat])
        return text(r[0]), int(r[1]) == 1

    @script
    async def start_job(self, stream: str, job: str, *, created: bool) -> bool:
        """``start_job.lua``, before ``add.lua`` (``job`` '') or after it answered
        ``job``: if an earlier job of the name ended (its ended-job marker names another
        job), what was appended after its end is skipped; with ``created``, the
        retention TTL and the cancel marker an earlier job left go
        (docs/design.md#job-identity). True if something was skipped."""
        r = await self.scripts.start_job(
            keys=[stream, self.keys.cancel(stream), self.keys.ended(stream)],
            args=[self.keys.group, job, "1" if created else "0"],
        )
        return int(r) == 1

    @script
    async def cancel_queued(self, stream: str) -> tuple[str, str, str]:
        """``cancel_queued.lua``: remove ``stream``'s indexed assignment if not delivered yet.

        Returns:
            ('removed' | 'delivered' | 'none', the assignment's id or '', its job or '').
        """
        r = await self.scripts.cancel_queued(
            keys=[self.keys.assignments, self.keys.active, self.keys.leases],
            args=[self.keys.group, stream, FIRST_ID_FIELD],
        )
        return text(r[0]), text(r[1]), text(r[2])

    @script
    async def skip_unread(self, stream: str, job: str) -> None:
        """``skip_unread.lua``: move the service's group on ``stream`` to its end (made
        there if missing) and mark ``job`` ended, so what a cancelled, never-read job left,
        or its producer appends later, is not handed to the next job of the same name."""
        await self.scripts.skip_unread(
            keys=[stream, self.keys.ended(stream)],
            args=[self.keys.group, job, ENDED_MARKER_TTL_MS],
        )

    @script
    async def signal_cancel(
        self, stream: str, reason: str, marker_ttl_ms: int, job: str = ""
    ) -> bool:
        """Tell ``stream``'s owner to stop (``cancel_stream.lua``): the cancel marker its
        next fenced read sees, and in the same script an end marker carrying the reason
        that wakes an owner waiting for entries (not written if the stream is gone or
        already ends in an end marker). ``job``: the job being cancelled ('' unknown).
        False if the cancel was moot (that job is over already): nothing was written."""
        r = await self.scripts.cancel_stream(
            keys=[stream, self.keys.cancel(stream), self.keys.ended(stream)],
            args=[
                reason, marker_ttl_ms, EOS_FIELD, EOS_VALUE, CANCEL_FIELD, self.keys.group, job,
            ],
        )  # fmt: skip
        return int(r) != 2

    @translated
    async def append(self, stream: str, fields: Mapping[str, str | bytes | int | float]) -> str:
        """Append one entry to a data stream; returns its id."""
        return text(await self.client.xadd(stream, dict(fields)))
