"""How an owned stream's lock ends: the seal of a finishing stream, the release, and the
one-call completion (seal, finish and release) of a single server."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._keys import Keys
from .._wire import STREAM_FIELD
from ._boundary import (
    ENDED_MARKER_TTL_MS,
    Core,
    channelled,
)
from ._scripts import Scripts


class CompletionCommands:
    """How an owned stream's lock ends: seal, release, and the one-call completion."""

    def __init__(self, core: Core) -> None:
        self.core = core
        self.client: Any = core.client
        self.keys: Keys = core.keys
        self.scripts: Scripts = core.scripts

    @channelled
    async def complete(
        self,
        stream: str,
        token: str,
        keep_ms: int,
        assignment_id: str,
        ack: Sequence[str] = (),
        *,
        cancelled: bool = False,
        job: str = "",
    ) -> tuple[bool, bool]:
        """:meth:`seal`, ``finish`` and :meth:`release` in one script, for a server that
        holds every key (``ClusterMode.NONE``): ``(sealed, finished)``.

        Not sealed: the token did not match, nothing was done (the lock is lost).
        Sealed: the lock is released too; ``finished`` is False when the assignment
        was no longer pending (a recoverer re-queued it).
        """
        keys = self.keys
        r = await self.scripts.complete(
            keys=[
                keys.lock(stream), stream, keys.cancel(stream), keys.ended(stream),
                keys.assignments, keys.leases, keys.active,
            ],
            args=[
                token, keys.group, keep_ms, "cancel" if cancelled else "", job,
                ENDED_MARKER_TTL_MS, keys.group, assignment_id, STREAM_FIELD, *ack,
            ],
        )  # fmt: skip
        return int(r[0]) == 1, int(r[1]) == 1

    @channelled
    async def release(
        self,
        stream: str,
        token: str,
        keep_ms: int,
        ack: Sequence[str] = (),
        *,
        ended: bool = False,
    ) -> bool:
        """Fenced final ack, unlock, and retention (-1 keep, 0 delete, >0 PEXPIRE ms).

        ``ended``: the release after the seal of a finished job: every entry still
        pending in the group is acked too (a contender whose acquisition failed read
        past the end marker between the seal and now)."""
        r = await self.scripts.release(
            keys=[self.keys.lock(stream), stream],
            args=[token, self.keys.group, keep_ms, "ended" if ended else "", *ack],
        )
        return int(r) == 1

    @channelled
    async def seal(
        self,
        stream: str,
        token: str,
        keep_ms: int,
        ack: Sequence[str] = (),
        *,
        cancelled: bool = False,
        job: str = "",
        lock_cap_ms: int = 0,
    ) -> bool:
        """Fenced final acks and retention of a finishing stream; the lock stays held.
        Every entry still pending in the group is acked too: the job is over, and a
        contender whose acquisition failed may have read past its end marker.

        ``cancelled``: the job ended early: also move the group to the stream's end
        and mark ``job`` ended early (docs/design.md#job-identity). The cancel marker
        goes either way.
        ``lock_cap_ms`` > 0: the lock's TTL is set to that, so an owner that
        dies after completing the assignment leaves no long-lived lock
        (docs/design.md#sessions).
        """
        r = await self.scripts.seal(
            keys=[
                self.keys.lock(stream), stream, self.keys.cancel(stream), self.keys.ended(stream),
            ],
            args=[
                token, self.keys.group, keep_ms, "cancel" if cancelled else "", job,
                ENDED_MARKER_TTL_MS, lock_cap_ms, *ack,
            ],
        )  # fmt: skip
        return int(r) == 1
