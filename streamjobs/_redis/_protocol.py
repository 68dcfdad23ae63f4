"""The commands the runtime needs, as a protocol (:class:`StreamGateway`), and the
values they exchange."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, Protocol

from .._deadletter import (
    Pairs,
)
from .._keys import Keys
from ..metrics import ServiceSample
from ._boundary import (
    LostAt,
)
from ._replies import (
    RawFields,
    ReadReply,
)

GroupEntry = tuple[str, Any]
"""``(id, fields)``; fields are None for an entry still pending but no longer in the
stream (trimmed or deleted)."""


class GroupRead(NamedTuple):
    """What :meth:`GroupCommands.ack_and_read` got."""

    refused: bool
    """The acknowledgement was refused: the member is dead (nothing acknowledged, and
    what the read delivered to it is another member's to reclaim)."""
    entries: list[GroupEntry]
    newest: str
    """The id of the stream's newest entry (``0-0``: empty), for the idle wait."""


class Reclaimed(NamedTuple):
    """What one reclaim pass (:meth:`GroupCommands.reclaim`) did."""

    alive: bool
    """False: the reclaiming member is dead (nothing claimed)."""
    ids: list[str]
    """The entries claimed for the reclaiming member (read them next)."""


SessionMode = Literal["create", "renew", "end", "forget"]


@dataclass(frozen=True, slots=True)
class Pending:
    """One entry of XPENDING's extended form: its id, the consumer holding it, and how
    long ago it was delivered (ms)."""

    id: str
    consumer: str
    idle_ms: int = field(default=0, compare=False)


class AssignmentOps(Protocol):
    """The runtime's commands of the assignment stream (``_redis/_assignments.py``)."""

    async def ensure_group(self) -> None: ...
    async def load_scripts(self) -> None: ...
    async def read_assignments(
        self, consumer: str, count: int, block_ms: int
    ) -> list[tuple[str, RawFields]]: ...
    async def fetch_assignment(self, entry_id: str) -> RawFields | None: ...
    async def pending_page(
        self, min_idle_ms: int, start: str, count: int, consumer: str | None = None
    ) -> list[Pending]: ...
    async def pending_owner(self, entry_id: str) -> str: ...
    async def lease_scores(self, ids: Sequence[str]) -> list[float | None]: ...
    async def server_time_ms(self) -> int: ...
    async def ping(self) -> None: ...
    async def sample(self) -> ServiceSample: ...
    async def finish(self, assignment_id: str) -> bool: ...
    async def requeue(
        self, assignment_id: str, retry_count: int | None, *, lost_at: LostAt = None
    ) -> str | None: ...
    async def dead_letter_assignment(
        self, assignment_id: str, meta: Pairs
    ) -> tuple[str, int] | None: ...
    async def dead_letter_entry(self, fields: Pairs) -> tuple[str, int]: ...


class StreamOps(Protocol):
    """The runtime's commands of data streams and their locks (``_redis/_streams.py``)."""

    async def acquire(
        self, stream: str, token: str, ttl_ms: int, replace: str = "", job: str = ""
    ) -> int: ...
    async def acquire_and_read(
        self, stream: str, token: str, ttl_ms: int, job: str, consumer: str, count: int
    ) -> tuple[int, ReadReply | None]: ...
    async def extend_many(
        self, locks: Sequence[tuple[str, str]], ttl_ms: int
    ) -> list[bool | None]: ...
    async def record_leases(self, ids: Sequence[str], ttl_ms: int, *, new: bool) -> None: ...
    async def take_leases(self, ids: Sequence[str], consumer: str, ttl_ms: int) -> list[bool]: ...
    async def fenced_read(
        self,
        stream: str,
        token: str,
        consumer: str,
        count: int,
        ack: Sequence[str],
        *,
        claim: bool = False,
        reply_bytes: int = 0,
    ) -> ReadReply: ...
    async def wait_for_entries(self, stream: str, after_id: str, block_ms: int) -> None: ...


class CompletionOps(Protocol):
    """The runtime's commands of how an owned stream's lock ends (``_redis/_completion.py``)."""

    async def release(
        self, stream: str, token: str, keep_ms: int, ack: Sequence[str] = (), *, ended: bool = False
    ) -> bool: ...
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
    ) -> bool: ...
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
    ) -> tuple[bool, bool]: ...


class LivenessOps(Protocol):
    """The runtime's commands of whether a holder is alive (``_redis/_liveness.py``)."""

    async def record_stop(self, consumer: str, stopped: bool) -> None: ...
    async def lock_exists(self, stream: str) -> bool: ...
    async def lock_alive(self, stream: str) -> bool: ...
    async def lock_state(self, stream: str) -> tuple[bool, str | None]: ...
    async def session_alive(
        self, consumer: str, incarnation: str, service: str | None = None
    ) -> bool: ...
    async def lock_holder(self, stream: str) -> str | None: ...
    async def lock_and_cancel(self, stream: str) -> tuple[str | None, str | None]: ...
    async def lock_and_ended(self, stream: str) -> tuple[str | None, str | None]: ...
    async def is_end_marker(self, stream: str, entry_id: str) -> bool: ...
    async def touch_session(self, consumer: str, value: str, ttl_ms: int) -> None: ...
    async def end_session(self, consumer: str) -> None: ...
    async def session(
        self, mode: SessionMode, consumer: str, value: str, ttl_ms: int, incarnation: str
    ) -> bool: ...
    async def sweep_sessions(self, limit: int, recheck_ms: int) -> list[tuple[str, int]]: ...
    async def next_due_ms(self) -> int | None: ...
    async def sweep_leases(
        self, horizon_ms: int, limit: int, recheck_ms: int
    ) -> list[tuple[str, int]]: ...
    async def prune_consumers(self, min_idle_ms: int, keep: str) -> list[str]: ...
    async def take_scan_lease(self, owner: str, ttl_ms: int) -> bool: ...
    async def unblock(self, client_id: int) -> bool: ...
    async def scan_cursor(self) -> str: ...
    async def save_scan_cursor(self, cursor: str) -> None: ...


class GroupOps(Protocol):
    """The commands of shared groups (``_redis/_groups.py``), as a ``GroupConsumer``
    uses them."""

    async def join(self, stream: str, member: str, ttl_ms: int, start_id: str) -> None: ...
    async def leave(self, stream: str, member: str) -> int: ...
    async def register(self, stream: str) -> None: ...
    async def ack(self, stream: str, member: str, ids: Sequence[str]) -> bool: ...
    async def ack_and_read(
        self, stream: str, member: str, ids: Sequence[str], count: int
    ) -> GroupRead: ...
    async def history(self, stream: str, member: str, count: int) -> list[GroupEntry]: ...
    async def count_start(self, stream: str, entry_id: str) -> int: ...
    async def beat(
        self, streams: Sequence[str], members: Sequence[str], ttl_ms: int
    ) -> list[bool]: ...
    async def reclaim(
        self, stream: str, member: str, count: int, min_idle_ms: int, forget_ms: int
    ) -> Reclaimed: ...
    async def trim(
        self,
        stream: str,
        *,
        acknowledged: bool,
        max_len: int,
        max_age_ms: int,
        batch: int,
        pace_ms: int,
    ) -> tuple[int, int]: ...


class GroupGateway(Protocol):
    """What a ``GroupConsumer``'s runtime uses of its gateway. :class:`Gateway` runs it
    on Redis; the test suite's in-memory fake implements it too."""

    keys: Keys
    raw_fields: bool
    last_ok: float | None

    @property
    def assignments(self) -> AssignmentOps: ...
    @property
    def groups(self) -> GroupOps: ...


class StreamGateway(Protocol):
    """The commands the runtime needs, by command group. :class:`Gateway` runs them on
    Redis; the test suite has an in-memory fake of this protocol for the life-cycle
    logic."""

    keys: Keys
    raw_fields: bool
    """Hand data entries' fields over as bytes (a consumer in bytes mode)."""

    @property
    def assignments(self) -> AssignmentOps: ...
    @property
    def streams(self) -> StreamOps: ...
    @property
    def completion(self) -> CompletionOps: ...
    @property
    def liveness(self) -> LivenessOps: ...
