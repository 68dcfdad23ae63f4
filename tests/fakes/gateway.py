"""An in-memory fake of :class:`streamjobs._redis.StreamGateway`.

:class:`FakeGateway` keeps the state the Lua scripts and commands of
:class:`~streamjobs._redis.Gateway` work on in plain Python objects and gives every
method the observable semantics of its script (streamjobs/lua/*.lua):

* the assignment stream (LBS): entries, one consumer group with a pending list
  (entry id -> consumer, delivery time);
* data streams: entries, the group's last-delivered id and pending list, retention
  (a deadline on the fake clock after ``release(keep_ms > 0)``);
* lock keys: token and deadline on an injectable clock (monotonic milliseconds);
* the lease index (assignment id -> deadline) and the dead-letter stream;
* the active-assignment index (data stream -> id of the assignment :meth:`submit`
  queued for it, kept up to date by finish, re-queue and dead-letter) and the
  idempotency keys (``add.lua``).

Each method runs its whole effect between two awaits, as a script runs atomically on
the server. Before the effect there is a checkpoint (a cancellation there means the
command was never sent), then the method's fault and gate, if any (see :meth:`fail`
and :meth:`gate`). A gate or fault created with ``after=True`` acts once the effect is
done: the command ran but its reply never arrived. No method leaves half an effect
behind when cancelled at any of its awaits.

Differences from Redis that the runtime cannot observe: entry ids come from the fake
clock (``ms-seq``, strictly increasing per stream); ``MAXLEN ~`` trims exactly;
expired keys are dropped lazily, when next looked at.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel

from streamjobs._deadletter import DEAD_AT_FIELD, Pairs
from streamjobs._keys import Keys
from streamjobs._redis import Entry, LostAt, Pending, RawFields, ReadReply, SessionMode, text
from streamjobs._session import incarnation_of, parse_session_token
from streamjobs._wire import (
    CANCEL_FIELD,
    EOS_FIELD,
    EOS_VALUE,
    FIRST_ID_FIELD,
    LOST_AT_FIELD,
    RETRY_FIELD,
    STREAM_FIELD,
    build_fields,
    is_eos,
)
from streamjobs.exceptions import NoSuchGroup, RedisUnavailable
from streamjobs.metrics import ServiceSample

if TYPE_CHECKING:
    from tests.fakes.groups import FakeGroups

StreamId = tuple[int, int]

METHODS = frozenset(
    {
        "ensure_group",
        "session",
        "session_alive",
        "lock_alive",
        "lock_state",
        "lock_and_cancel",
        "next_due_ms",
        "sweep_sessions",
        "read_assignments",
        "fetch_assignment",
        "pending_page",
        "pending_owner",
        "lease_scores",
        "server_time_ms",
        "ping",
        "sample",
        "finish",
        "requeue",
        "dead_letter_assignment",
        "dead_letter_entry",
        "acquire",
        "acquire_and_read",
        "record_stop",
        "extend_many",
        "record_leases",
        "take_leases",
        "complete",
        "lock_and_ended",
        "fenced_read",
        "load_scripts",
        "wait_for_entries",
        "release",
        "lock_exists",
        "lock_holder",
        "sweep_leases",
        "prune_consumers",
        "take_scan_lease",
        "unblock",
        "touch_session",
        "end_session",
        "scan_cursor",
        "save_scan_cursor",
        "is_end_marker",
        "seal",
    }
)
"""Every method of the ``StreamGateway`` protocol (names :meth:`gate` and :meth:`fail` accept)."""


def parse_id(entry_id: str) -> StreamId:
    """``"ms-seq"`` (or ``"ms"``) as a tuple that orders like Redis orders stream ids."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def _largest(batch: Sequence[Entry]) -> int:
    """Bytes of the largest entry (field names and values, UTF-8)."""
    return max(
        (
            sum(
                len(k.encode(errors="surrogateescape")) + len(v.encode(errors="surrogateescape"))
                for k, v in fields.items()
            )
            for _, fields in batch
        ),
        default=0,
    )


def format_id(sid: StreamId) -> str:
    return f"{sid[0]}-{sid[1]}"


def monotonic_ms() -> int:
    """The default clock: the process's monotonic time, milliseconds."""
    return time.monotonic_ns() // 1_000_000


class ManualClock:
    """A clock that moves only when told to (``advance``); pass it as ``clock=``."""

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self.now_ms = start_ms

    def __call__(self) -> int:
        return self.now_ms

    def advance(self, ms: int) -> None:
        self.now_ms += ms


class _Signal:
    """Wakes every waiter when something changed (an Event replaced on each change)."""

    def __init__(self) -> None:
        self._event: anyio.Event | None = None

    def notify(self) -> None:
        if self._event is not None:
            self._event.set()
            self._event = None

    def current(self) -> anyio.Event:
        if self._event is None:
            self._event = anyio.Event()
        return self._event


class Gate:
    """Holds calls of one method until :meth:`release` (see :meth:`FakeGateway.gate`).

    Attributes:
        method: the gated method.
        after: True if calls are held after their effect (the reply is what waits).
        entered: set once a call reached the gate.
        calls: how many calls reached it so far.
        waiting: how many calls wait at it now.
    """

    def __init__(self, method: str, after: bool) -> None:
        self.method = method
        self.after = after
        self.entered = anyio.Event()
        self.calls = 0
        self.waiting = 0
        self._released = anyio.Event()

    @property
    def released(self) -> bool:
        return self._released.is_set()

    def release(self) -> None:
        """Let every held call and every later one through."""
        self._released.set()

    async def pass_through(self) -> None:
        self.calls += 1
        self.entered.set()
        if self._released.is_set():
            return
        self.waiting += 1
        try:
            await self._released.wait()
        finally:
            self.waiting -= 1


@dataclass
class _Fault:
    times: int
    after: bool
    error: Exception | None = None


@dataclass
class _Delivery:
    consumer: str
    at_ms: int
    count: int = 1


@dataclass
class _Group:
    last_delivered: StreamId = (0, 0)
    pel: dict[str, _Delivery] = field(default_factory=dict)


@dataclass
class _Stream:
    entries: dict[str, dict[str, bytes | str]] = field(default_factory=dict)
    last_id: StreamId = (0, 0)
    group: _Group | None = None
    expires_at_ms: int | None = None

    def top(self) -> str:
        """Id of the newest entry ('0-0' if empty), as XREVRANGE + - COUNT 1 gives it."""
        return next(reversed(self.entries), "0-0")


@dataclass(frozen=True, slots=True)
class Call:
    """One call of a gateway method, as :attr:`FakeGateway.calls` records it."""

    method: str
    args: tuple[Any, ...]


@dataclass
class _Lock:
    token: str
    expires_at_ms: int | None


class FakeGateway:
    """An in-memory ``StreamGateway``; see the module docstring.

    Args:
        keys: the service's key names (only ``keys.service`` and ``keys.lock()`` matter).
        clock: milliseconds on a monotonic clock; lock and retention deadlines, lease
            deadlines, pending idle times and entry ids use it. Default: real time.
        dlq_maxlen: cap of the dead-letter stream; 0 = unbounded.
    """

    # One object plays every command group of the real gateway (``Gateway.streams``,
    # ``.assignments``, ...): its methods are flat, as the protocol's groups are disjoint.

    @property
    def assignments(self) -> FakeGateway:
        return self

    @property
    def streams(self) -> FakeGateway:
        return self

    @property
    def completion(self) -> FakeGateway:
        return self

    @property
    def liveness(self) -> FakeGateway:
        return self

    @property
    def writes(self) -> FakeGateway:
        return self

    @functools.cached_property
    def groups(self) -> FakeGroups:
        """The group steps of a ``GroupConsumer``, over these data streams."""
        from tests.fakes.groups import FakeGroups

        return FakeGroups(self)

    def __init__(
        self,
        keys: Keys | None = None,
        *,
        clock: Callable[[], int] = monotonic_ms,
        dlq_maxlen: int = 0,
    ) -> None:
        self.keys = keys or Keys("svc")
        self.raw_fields = False
        self.clock = clock
        self.dlq_maxlen = dlq_maxlen
        self.calls: list[Call] = []
        self.last_ok: float | None = None
        """When (``time.monotonic()``) a call last got its reply, as ``Gateway.last_ok``."""
        self.lbs_history: list[tuple[str, dict[str, bytes | str]]] = []
        """Every entry ever added to the assignment stream (re-queues included), in order."""
        self._lbs = _Stream()
        self._dlq = _Stream()
        self._data: dict[str, _Stream] = {}
        self._locks: dict[str, _Lock] = {}
        self._leases: dict[str, float] = {}
        self._scan_lease: tuple[str, int] | None = None  # (owner, expires at ms)
        self._scan_cursor = "-"
        self._active: dict[str, str] = {}
        self._idempotency: dict[str, tuple[str, int]] = {}  # key -> (id, expiry ms)
        self._lbs_changed = _Signal()
        self._data_changed = _Signal()
        self._gates: dict[str, Gate] = {}
        self._faults: dict[str, _Fault] = {}
        self.stopped: dict[str, int] = {}
        """Consumers whose last run stopped cleanly: name -> when (``record_stop``)."""
        self.cancels: dict[str, str] = {}
        """Cancel markers: data stream -> reason (``Producer.cancel_stream``)."""
        self.ended: dict[str, tuple[str, str]] = {}
        """Ended-job markers: data stream -> ('e' early or 'n' at its end marker, the
        job that ended) (``Keys.ended``)."""
        self.sessions: dict[str, str] = {}
        """Live consumer sessions: name -> value."""
        self.unreachable: set[str] = set()
        """Streams whose lock's node does not answer heartbeats (``extend_many``)."""
        self.other_services: dict[str, FakeGateway] = {}
        """Gateways of other services whose sessions lock tokens may name (by service)."""

    # -- test controls ---------------------------------------------------------------

    def gate(self, method: str, *, after: bool = False) -> Gate:
        """Hold every call of ``method`` until the returned gate is released.

        ``after=False`` holds a call before it has any effect (still unsent);
        ``after=True`` runs its effect first and holds its reply.
        """
        self._check_method(method)
        gate = Gate(method, after)
        self._gates[method] = gate
        return gate

    def fail(
        self,
        method: str,
        times: int = 1,
        *,
        after: bool = False,
        error: Exception | None = None,
    ) -> None:
        """Make the next ``times`` calls of ``method`` raise ``RedisUnavailable``, or
        ``error`` (say, a raw ``AttributeError`` from inside a client).

        ``after=True``: the call takes effect first, then raises (a lost reply).
        """
        self._check_method(method)
        self._faults[method] = _Fault(times, after, error)

    def fail_clear(self) -> None:
        """Forget every failure :meth:`fail` injected and has not spent yet."""
        self._faults.clear()

    def calls_of(self, method: str) -> list[tuple[Any, ...]]:
        """The arguments of every call of ``method`` so far."""
        return [c.args for c in self.calls if c.method == method]

    @staticmethod
    def _check_method(method: str) -> None:
        from tests.fakes.groups import GROUP_METHODS

        if method not in METHODS and method not in GROUP_METHODS:
            raise ValueError(f"{method!r} is not a StreamGateway method")

    # -- producing (synchronous helpers) ---------------------------------------------

    def add_assignment(
        self, stream: str, info: Mapping[str, Any] | None = None, /, **extra: str
    ) -> str:
        """Append an assignment for ``stream`` (``extra``: more fields, e.g. ``_retry_count``)."""
        return self.add_raw_assignment({**build_fields(stream, info), **extra})

    def add_raw_assignment(self, fields: Mapping[str, bytes | str]) -> str:
        """Append an assignment entry with exactly these fields (even unparseable ones)."""
        return self._xadd_lbs(dict(fields))

    def submit(
        self,
        stream: str,
        info: Mapping[str, Any] | None = None,
        /,
        *,
        idempotency_key: str | None = None,
        window_ms: int = 86_400_000,
    ) -> tuple[str, bool]:
        """``Producer.add_stream`` (add.lua): the idempotency key's id if it is alive,
        else the stream's unfinished assignment (an index entry pointing at an entry
        that still exists), else a new assignment. Returns (id, queued now)."""
        now = self.clock()
        if idempotency_key is not None:
            earlier = self._idempotency.get(idempotency_key)
            if earlier is not None and earlier[1] > now:
                return earlier[0], False
        self.start_job(stream, "", created=False)
        current = self._active.get(stream)
        created = current is None or current not in self._lbs.entries
        if created:
            current = self._xadd_lbs(dict(build_fields(stream, info)))
            self._active[stream] = current
        assert current is not None
        if idempotency_key is not None:
            self._idempotency[idempotency_key] = (current, now + window_ms)
        if created:
            self.start_job(stream, current, created=True)
        return current, created

    def start_job(self, stream: str, job: str, *, created: bool) -> None:
        """start_job.lua: with ``created`` the retention TTL and the cancel marker go; an
        earlier job that ended (a marker naming another job, or any before add.lua:
        ``job`` '') has what was appended after its end skipped."""
        s = self._data_stream(stream)
        if created:
            self.cancels.pop(stream, None)
            if s is not None:
                s.expires_at_ms = None
        ended = self.ended.get(stream)
        if ended is not None and ended[1] != job:
            self._skip_to_end(s)
            del self.ended[stream]

    def _skip_to_end(self, s: _Stream | None) -> None:
        """_skip.lua: XGROUP CREATE/SETID ... $, and every pending entry acked."""
        if s is not None:
            if s.group is None:
                s.group = _Group()
            s.group.last_delivered = s.last_id
            s.group.pel.clear()

    def _job_of(self, assignment_id: str) -> str:
        fields = self._lbs.entries.get(assignment_id, {})
        first = fields.get(FIRST_ID_FIELD)
        if first is None:
            return assignment_id
        return first.decode() if isinstance(first, bytes) else first

    def cancel(self, stream: str, reason: str = "") -> str:
        """``Producer.cancel_stream``: 'removed', 'signalled', 'moot' or 'not_found'."""
        current = self._active.get(stream)
        job = "" if current is None else self._job_of(current)
        if self.cancel_queued(stream):
            return "removed"
        if current is None and self._live_lock(self.keys.lock(stream)) is None:
            return "not_found"
        return "signalled" if self.signal_cancel(stream, reason, job) else "moot"

    def append(self, stream: str, fields: Mapping[str, str]) -> str:
        """Append an entry to a data stream (created if missing); returns its id."""
        if not fields:
            raise ValueError("a stream entry needs at least one field")
        s = self._data_stream(stream)
        if s is None:
            s = self._data[stream] = _Stream()
        entry_id = self._xadd(s, dict(fields))
        self._data_changed.notify()
        return entry_id

    def append_many(self, stream: str, count: int, start: int = 0) -> list[str]:
        """Append ``count`` entries ``{"n": str(i)}``; returns their ids."""
        return [self.append(stream, {"n": str(i)}) for i in range(start, start + count)]

    def close(self, stream: str) -> str:
        """Append the end-of-stream marker."""
        return self.append(stream, {EOS_FIELD: EOS_VALUE})

    def cancel_queued(self, stream: str) -> bool:
        """cancel_queued.lua: delete ``stream``'s indexed assignment if no consumer has read it
        yet; True if it did."""
        current = self._active.get(stream)
        if current is None or current not in self.lbs_undelivered:
            return False
        job = self._job_of(current)
        del self._lbs.entries[current]
        del self._active[stream]
        self._leases.pop(current, None)
        # skip_unread.lua: the group goes to the end, the job is marked ended
        self._skip_to_end(self._data_stream(stream))
        self.ended[stream] = ("e", job)
        return True

    def signal_cancel(self, stream: str, reason: str, job: str = "") -> bool:
        """cancel_stream.lua: nothing if moot (the ended-job marker names ``job``, or
        exists with ``job`` unknown; or the group read the newest entry, an end marker
        newer than ``job``); else the cancel marker, then an end marker carrying the
        reason unless the stream is missing or its newest entry is an end marker newer
        than ``job`` (one no newer is an earlier job's, equal ids included: the owner
        waits after it, and only the appended marker wakes it). False if moot."""
        ended = self.ended.get(stream)
        if ended is not None and (not job or ended[1] == job):
            return False
        s = self._data_stream(stream)
        top_is_eos = (
            s is not None
            and bool(s.entries)
            and s.entries[s.top()].get(EOS_FIELD) in (EOS_VALUE, EOS_VALUE.encode())
        )
        if s is not None and top_is_eos:
            top = parse_id(s.top())
            read = s.group is not None and s.group.last_delivered >= top
            if read and (not job or top > parse_id(job)):
                return False
        self.cancels[stream] = reason
        earlier_jobs_end = top_is_eos and bool(job) and parse_id(s.top()) <= parse_id(job)
        if s is None or not s.entries or (top_is_eos and not earlier_jobs_end):
            return True
        self.append(stream, {EOS_FIELD: EOS_VALUE, CANCEL_FIELD: reason})
        return True

    # -- forcing state ------------------------------------------------------------------

    def expire_lock(self, stream: str) -> None:
        """Make the lock of ``stream`` expire now (as if its TTL had run out)."""
        self._locks.pop(self.keys.lock(stream), None)

    def set_lock(self, stream: str, token: str, ttl_ms: int | None = None) -> None:
        """Make someone else hold the lock of ``stream`` (no TTL by default)."""
        expires = None if ttl_ms is None else self.clock() + ttl_ms
        self._locks[self.keys.lock(stream)] = _Lock(token, expires)

    # -- inspection ---------------------------------------------------------------------

    @property
    def locks(self) -> dict[str, str]:
        """Live locks: data stream -> token."""
        out = {}
        for key in list(self._locks):
            lock = self._live_lock(key)
            stream = self.keys.stream_of_lock(key)
            if lock is not None and stream is not None:
                out[stream] = lock.token
        return out

    def lock_token(self, stream: str) -> str | None:
        lock = self._live_lock(self.keys.lock(stream))
        return None if lock is None else lock.token

    def lock_ttl_ms(self, stream: str) -> int | None:
        """Time left on the lock (None: no lock, or no TTL)."""
        lock = self._live_lock(self.keys.lock(stream))
        if lock is None or lock.expires_at_ms is None:
            return None
        return lock.expires_at_ms - self.clock()

    @property
    def leases(self) -> dict[str, float]:
        """The lease index: assignment id -> deadline (fake-clock ms)."""
        return dict(self._leases)

    @property
    def active(self) -> dict[str, str]:
        """The active-assignment index: data stream -> assignment id."""
        return dict(self._active)

    @property
    def lbs_entries(self) -> list[tuple[str, dict[str, bytes | str]]]:
        """Entries now in the assignment stream, oldest first."""
        return [(i, dict(f)) for i, f in self._lbs.entries.items()]

    @property
    def lbs_pending(self) -> dict[str, str]:
        """The assignment group's pending list: entry id -> consumer."""
        group = self._lbs.group
        return {} if group is None else {i: d.consumer for i, d in group.pel.items()}

    @property
    def lbs_undelivered(self) -> list[str]:
        """Ids of assignments no consumer has read yet."""
        group = self._lbs.group
        last = (0, 0) if group is None else group.last_delivered
        return [i for i in self._lbs.entries if parse_id(i) > last]

    def data_exists(self, stream: str) -> bool:
        return self._data_stream(stream) is not None

    def data_entries(self, stream: str) -> list[tuple[str, dict[str, str]]]:
        s = self._data_stream(stream)
        return [] if s is None else [(i, _decode(f)) for i, f in s.entries.items()]

    def data_pending(self, stream: str) -> dict[str, str]:
        """The data stream's pending list: entry id -> consumer."""
        s = self._data_stream(stream)
        if s is None or s.group is None:
            return {}
        return {i: d.consumer for i, d in sorted(s.group.pel.items(), key=_by_id)}

    def data_acked(self, stream: str) -> list[str]:
        """Ids of existing entries that were delivered and acknowledged."""
        s = self._data_stream(stream)
        if s is None or s.group is None:
            return []
        g = s.group
        return [i for i in s.entries if parse_id(i) <= g.last_delivered and i not in g.pel]

    def data_ttl_ms(self, stream: str) -> int | None:
        """Retention left on a data stream (None: no TTL, or no stream)."""
        s = self._data_stream(stream)
        if s is None or s.expires_at_ms is None:
            return None
        return s.expires_at_ms - self.clock()

    @property
    def dead_letters(self) -> list[tuple[str, dict[str, str]]]:
        """The dead-letter stream, oldest first (values decoded like redis replies)."""
        return [(i, _decode(f)) for i, f in self._dlq.entries.items()]

    # -- the protocol: assignment stream ------------------------------------------------

    async def load_scripts(self) -> None:
        """SCRIPT LOAD of every script: nothing to do in memory."""
        await self._enter("load_scripts")
        await self._leave("load_scripts")

    async def ensure_group(self) -> None:
        await self._enter("ensure_group")
        if self._lbs.group is None:
            self._lbs.group = _Group()
        await self._leave("ensure_group")

    async def read_assignments(
        self, consumer: str, count: int, block_ms: int
    ) -> list[tuple[str, RawFields]]:
        await self._enter("read_assignments", consumer, count, block_ms)
        deadline = time.monotonic() + block_ms / 1000
        while True:
            group = self._lbs.group
            if group is None:
                raise NoSuchGroup("NOGROUP (fake): the assignment group does not exist")
            batch = self._deliver_new(self._lbs, group, consumer, count)
            if batch:
                out = [(i, dict(f)) for i, f in batch]
                await self._leave("read_assignments")
                return out
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                await self._leave("read_assignments")
                return []
            changed = self._lbs_changed.current()
            with anyio.move_on_after(remaining):
                await changed.wait()

    async def fetch_assignment(self, entry_id: str) -> RawFields | None:
        await self._enter("fetch_assignment", entry_id)
        fields = self._lbs.entries.get(entry_id)
        out = None if fields is None else dict(fields)
        await self._leave("fetch_assignment")
        return out

    async def pending_page(
        self, min_idle_ms: int, start: str, count: int, consumer: str | None = None
    ) -> list[Pending]:
        await self._enter("pending_page", min_idle_ms, start, count)
        group = self._lbs.group
        if group is None:
            raise NoSuchGroup("NOGROUP (fake): the assignment group does not exist")
        if start == "-":
            lowest, inclusive = (0, 0), True
        elif start.startswith("("):
            lowest, inclusive = parse_id(start[1:]), False
        else:
            lowest, inclusive = parse_id(start), True
        now = self.clock()
        out = []
        for entry_id, d in sorted(group.pel.items(), key=_by_id):
            sid = parse_id(entry_id)
            if sid < lowest or (sid == lowest and not inclusive):
                continue
            if now - d.at_ms < min_idle_ms or consumer not in (None, d.consumer):
                continue
            out.append(Pending(id=entry_id, consumer=d.consumer, idle_ms=int(now - d.at_ms)))
            if len(out) >= count:
                break
        await self._leave("pending_page")
        return out

    async def pending_owner(self, entry_id: str) -> str:
        await self._enter("pending_owner", entry_id)
        group = self._lbs.group
        if group is None:
            raise NoSuchGroup("NOGROUP (fake): the assignment group does not exist")
        d = group.pel.get(entry_id)
        await self._leave("pending_owner")
        return "" if d is None else d.consumer

    async def lease_scores(self, ids: Sequence[str]) -> list[float | None]:
        await self._enter("lease_scores", tuple(ids))
        out = [self._leases.get(i) for i in ids]
        await self._leave("lease_scores")
        return out

    async def server_time_ms(self) -> int:
        await self._enter("server_time_ms")
        now = self.clock()
        await self._leave("server_time_ms")
        return now

    async def ping(self) -> None:
        await self._enter("ping")
        await self._leave("ping")

    async def sample(self) -> ServiceSample:
        await self._enter("sample")
        group = self._lbs.group
        pel = group.pel if group is not None else {}
        oldest = min(pel, key=lambda i: tuple(map(int, i.split("-"))), default=None)
        age_s = 0.0 if oldest is None else max(0, self.clock() - int(oldest.split("-")[0])) / 1000
        consumers = len({d.consumer for d in pel.values()})
        await self._leave("sample")
        return ServiceSample(
            pending=len(pel),
            oldest_pending_age_s=age_s,
            dlq_length=len(self._dlq.entries),
            consumers=consumers,
        )

    async def finish(self, assignment_id: str) -> bool:
        """finish.lua: XACK; ZREM the lease; XDEL and drop the index entry pointing at it
        if the XACK acked."""
        await self._enter("finish", assignment_id)
        acked = self._finish(assignment_id)
        await self._leave("finish")
        return acked

    def _finish(self, assignment_id: str) -> bool:
        name = self._indexed_name(assignment_id)
        acked = self._xack_lbs(assignment_id)
        self._leases.pop(assignment_id, None)
        if acked:
            self._lbs.entries.pop(assignment_id, None)
            if name is not None:
                del self._active[name]
        return acked

    async def requeue(
        self, assignment_id: str, retry_count: int | None, *, lost_at: LostAt = None
    ) -> str | None:
        """requeue.lua: ZREM the lease; XACK (stop if 0); XADD a copy to the tail; XDEL;
        an index entry pointing at the original points at the copy."""
        await self._enter("requeue", assignment_id, retry_count)
        new_id = self._requeue(assignment_id, retry_count, lost_at)
        await self._leave("requeue")
        return new_id

    def _requeue(
        self, assignment_id: str, retry_count: int | None, lost_at: LostAt = None
    ) -> str | None:
        name = self._indexed_name(assignment_id)
        if lost_at == "lease":
            score = self._leases.get(assignment_id)
            now = self.clock()
            lost_at = now if score is None or score > now else int(score)
        self._leases.pop(assignment_id, None)
        if not self._xack_lbs(assignment_id):
            return None
        src = self._lbs.entries.get(assignment_id)
        if src is None:
            return None
        # Same field order as the script: the retry field keeps its place, then the
        # loss time, then a new retry field, then the first id.
        out = {k: v for k, v in src.items() if k != LOST_AT_FIELD}
        retry_seen = RETRY_FIELD in out
        if retry_count is not None and retry_seen:
            out[RETRY_FIELD] = str(retry_count)
        if lost_at is not None:
            out[LOST_AT_FIELD] = str(lost_at)
        if retry_count is not None and not retry_seen:
            out[RETRY_FIELD] = str(retry_count)
        out.setdefault(FIRST_ID_FIELD, assignment_id)
        new_id = self._xadd_lbs(out)
        self._lbs.entries.pop(assignment_id, None)
        if name is not None:
            self._active[name] = new_id
        return new_id

    async def dead_letter_assignment(
        self, assignment_id: str, meta: Pairs
    ) -> tuple[str, int] | None:
        """dead_letter_assignment.lua: ZREM; XACK (stop if 0); XADD fields + meta to the DLQ; XDEL;
        drop the index entry pointing at it."""
        await self._enter("dead_letter_assignment", assignment_id, tuple(meta))
        result = None
        name = self._indexed_name(assignment_id)
        self._leases.pop(assignment_id, None)
        if self._xack_lbs(assignment_id):
            replaced = {DEAD_AT_FIELD} | {k for k, _ in meta}
            src = self._lbs.entries.get(assignment_id, {})
            out: dict[str, bytes | str] = {k: v for k, v in src.items() if k not in replaced}
            out.update(meta)
            out[DEAD_AT_FIELD] = str(self.clock())
            result = self._xadd_dlq(out)
            self._lbs.entries.pop(assignment_id, None)
            if name is not None:
                del self._active[name]
        await self._leave("dead_letter_assignment")
        return result

    async def dead_letter_entry(self, fields: Pairs) -> tuple[str, int]:
        """dead_letter_entry.lua: XADD the fields and the time to the DLQ."""
        await self._enter("dead_letter_entry", tuple(fields))
        out: dict[str, bytes | str] = dict(fields)
        out.pop(DEAD_AT_FIELD, None)  # the script appends its own at the end
        out[DEAD_AT_FIELD] = str(self.clock())
        result = self._xadd_dlq(out)
        await self._leave("dead_letter_entry")
        return result

    # -- the protocol: locks and data streams ------------------------------------------

    async def acquire(
        self, stream: str, token: str, ttl_ms: int, replace: str = "", job: str = ""
    ) -> int:
        """acquire.lua: our token -> 1 (TTL refreshed); held -> 0 (unless it holds
        ``replace``); else lock + group at 0, and the data stream's retention TTL
        cleared. Taken with the ended-job marker naming ``job`` -> 2; naming another
        job -> the group moves to the end and the marker goes."""
        await self._enter("acquire", stream, token, ttl_ms)
        taken = self._acquire(stream, token, ttl_ms, replace, job)
        await self._leave("acquire")
        return taken

    async def record_stop(self, consumer: str, stopped: bool) -> None:
        """HSET / HDEL of the stop record (``Keys.stopped``)."""
        await self._enter("record_stop", consumer, stopped)
        if stopped:
            self.stopped[consumer] = self.clock()
        else:
            self.stopped.pop(consumer, None)
        await self._leave("record_stop")

    async def acquire_and_read(
        self, stream: str, token: str, ttl_ms: int, job: str, consumer: str, count: int
    ) -> tuple[int, ReadReply | None]:
        """acquire.lua, fence.lua and XREADGROUP in one MULTI: the read is returned only
        when the lock was taken; otherwise (held, or the job ended) the XREADGROUP still
        delivered new entries, which stay pending with ``consumer``."""
        await self._enter("acquire_and_read", stream, token, ttl_ms, consumer, count)
        taken = self._acquire(stream, token, ttl_ms, "", job)
        reply = None
        if taken == 1:
            reply = self._fenced_read(stream, token, consumer, count, ())
        else:
            s = self._data_stream(stream)
            if s is not None and s.group is not None:
                self._deliver_new(s, s.group, consumer, count)
        await self._leave("acquire_and_read")
        return taken, reply

    def _acquire(self, stream: str, token: str, ttl_ms: int, replace: str, job: str) -> int:
        key = self.keys.lock(stream)
        lock = self._live_lock(key)
        ended = self.ended.get(stream)
        if lock is not None and replace and lock.token == replace:
            del self._locks[key]
            lock = None
        if lock is not None:
            taken = 0
            if lock.token == token:
                lock.expires_at_ms = self.clock() + ttl_ms
                taken = 2 if ended is not None and ended[1] == job else 1
        else:
            self._locks[key] = _Lock(token, self.clock() + ttl_ms)
            s = self._data_stream(stream)
            if s is None:
                s = self._data[stream] = _Stream()
            if s.group is None:
                s.group = _Group()
            s.expires_at_ms = None
            taken = 1
            if ended is not None and ended[1] == job:
                taken = 2
            elif ended is not None:
                if ended[0] == "e":
                    self._skip_to_end(s)
                del self.ended[stream]
        return taken

    async def extend_many(self, locks: Sequence[tuple[str, str]], ttl_ms: int) -> list[bool | None]:
        """extend.lua per lock: PEXPIRE only if the token matches; never re-create.
        A stream in ``unreachable`` answers None (its cluster node is away)."""
        await self._enter("extend_many", tuple(locks), ttl_ms)
        out: list[bool | None] = []
        for stream, token in locks:
            if stream in self.unreachable:
                out.append(None)
                continue
            lock = self._live_lock(self.keys.lock(stream))
            if lock is not None and lock.token == token:
                lock.expires_at_ms = self.clock() + ttl_ms
                out.append(True)
            else:
                out.append(False)
        await self._leave("extend_many")
        return out

    async def record_leases(self, ids: Sequence[str], ttl_ms: int, *, new: bool) -> None:
        """lease.lua: ZADD of now + ttl_ms for assignments still pending (new), or
        ZADD XX (update)."""
        await self._enter("record_leases", tuple(ids), ttl_ms, new)
        deadline = float(self.clock() + ttl_ms)
        for i in ids:
            if (new and i in self.lbs_pending) or (not new and i in self._leases):
                self._leases[i] = deadline
        await self._leave("record_leases")

    async def take_leases(self, ids: Sequence[str], consumer: str, ttl_ms: int) -> list[bool]:
        """lease.lua 'own': a lease for each id still pending with ``consumer``, and
        which those are."""
        await self._enter("take_leases", tuple(ids), consumer, ttl_ms)
        deadline = float(self.clock() + ttl_ms)
        pending = self.lbs_pending
        out = []
        for i in ids:
            ours = pending.get(i) == consumer
            if ours:
                self._leases[i] = deadline
            out.append(ours)
        await self._leave("take_leases")
        return out

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
    ) -> ReadReply:
        """fence.lua + XREADGROUP, or claim.lua + XRANGE: token check; XACK ``ack``;
        pending entries first (claimed from whoever holds them), else new ones; the
        newest id when nothing was read; the size of the largest entry read."""
        await self._enter("fenced_read", stream, token, consumer, count, tuple(ack))
        result = self._fenced_read(stream, token, consumer, count, ack)
        if not result.owned and count and not claim:  # (claim.lua is fenced in Lua)
            self._stray_read(stream, consumer, count)
        await self._leave("fenced_read")
        return result

    def _stray_read(self, stream: str, consumer: str, count: int) -> None:
        """The XREADGROUP behind a failed fence still delivers; stray.lua then acks
        what it delivered if no one holds the lock and a job of the name ended."""
        s = self._data_stream(stream)
        if s is None or s.group is None:
            return
        stray = self._deliver_new(s, s.group, consumer, count)
        if self._live_lock(self.keys.lock(stream)) is None and stream in self.ended:
            for entry_id, _ in stray:
                s.group.pel.pop(entry_id, None)

    def _fenced_read(
        self, stream: str, token: str, consumer: str, count: int, ack: Sequence[str]
    ) -> ReadReply:
        lock = self._live_lock(self.keys.lock(stream))
        if lock is None or lock.token != token:
            return ReadReply(False, "", [])
        s = self._data_stream(stream)
        group = None if s is None else s.group
        for entry_id in ack:  # XACK of a missing key or group acks nothing
            if group is not None:
                group.pel.pop(entry_id, None)
        if count == 0:
            return ReadReply(True, "0-0", [])
        reason = self.cancels.get(stream)
        if reason is not None:
            return ReadReply(True, "0-0", [], cancelled=reason)
        if s is None or group is None:
            raise NoSuchGroup(f"NOGROUP (fake): no group on {stream!r}")
        # XAUTOCLAIM 0 from 0-0: pending entries of any consumer, oldest first; entries
        # deleted from the stream leave the pending list and are not returned.
        now = self.clock()
        claimed: list[Entry] = []
        for entry_id, d in sorted(group.pel.items(), key=_by_id):
            if len(claimed) >= count:
                break
            fields = s.entries.get(entry_id)
            if fields is None:
                del group.pel[entry_id]
                continue
            d.consumer, d.at_ms, d.count = consumer, now, d.count + 1
            claimed.append((entry_id, _decode(fields)))
        if claimed:
            return ReadReply(True, "0-0", claimed, _largest(claimed), claimed=True)
        new = [(i, _decode(f)) for i, f in self._deliver_new(s, group, consumer, count)]
        if new:
            return ReadReply(True, "0-0", new, _largest(new))
        return ReadReply(True, s.top(), [])

    async def wait_for_entries(self, stream: str, after_id: str, block_ms: int) -> None:
        """XREAD BLOCK: return once ``stream`` has an entry newer than ``after_id``."""
        await self._enter("wait_for_entries", stream, after_id, block_ms)
        after = parse_id(after_id)
        with anyio.move_on_after(block_ms / 1000):
            while True:
                s = self._data_stream(stream)
                if s is not None and s.entries and parse_id(s.top()) > after:
                    break
                await self._data_changed.current().wait()
        await self._leave("wait_for_entries")

    async def release(
        self,
        stream: str,
        token: str,
        keep_ms: int,
        ack: Sequence[str] = (),
        *,
        ended: bool = False,
    ) -> bool:
        """release.lua: token check; XACK ``ack`` (everything pending if ``ended``); DEL
        the lock; retention of the stream."""
        await self._enter("release", stream, token, keep_ms, tuple(ack))
        released = self._release(stream, token, keep_ms, ack, ended)
        await self._leave("release")
        return released

    def _release(
        self, stream: str, token: str, keep_ms: int, ack: Sequence[str], ended: bool = False
    ) -> bool:
        key = self.keys.lock(stream)
        lock = self._live_lock(key)
        released = lock is not None and lock.token == token
        if released:
            s = self._data_stream(stream)
            if s is not None and s.group is not None:
                for entry_id in ack:
                    s.group.pel.pop(entry_id, None)
                if ended:
                    s.group.pel.clear()
            del self._locks[key]
            if keep_ms == 0:
                self._data.pop(stream, None)
            elif keep_ms > 0 and s is not None:
                s.expires_at_ms = self.clock() + keep_ms
        return released

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
        """seal.lua: token check; XACK ``ack`` (everything pending if ``cancelled``, and
        ``job`` marked ended); drop the cancel marker; set the lock's TTL to
        ``lock_cap_ms`` (if > 0); PEXPIRE the stream if ``keep_ms`` > 0."""
        await self._enter("seal", stream, token, keep_ms, tuple(ack))
        sealed = self._seal(stream, token, keep_ms, ack, cancelled, job, lock_cap_ms)
        await self._leave("seal")
        return sealed

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
        """complete.lua: seal, finish and release at once (nothing if the token does
        not match)."""
        await self._enter("complete", stream, token, keep_ms, assignment_id, tuple(ack))
        finished = False
        sealed = self._seal(stream, token, keep_ms, ack, cancelled, job, 0)
        if sealed:
            finished = self._finish(assignment_id)
            self._release(stream, token, 0 if keep_ms == 0 else -1, ())
        await self._leave("complete")
        return sealed, finished

    def _seal(
        self,
        stream: str,
        token: str,
        keep_ms: int,
        ack: Sequence[str],
        cancelled: bool,
        job: str,
        lock_cap_ms: int,
    ) -> bool:
        lock = self._live_lock(self.keys.lock(stream))
        sealed = lock is not None and lock.token == token
        if sealed:
            s = self._data_stream(stream)
            if s is not None and s.group is not None:
                for entry_id in ack:
                    s.group.pel.pop(entry_id, None)
                s.group.pel.clear()  # the job is over: nothing pending is ever handled
                if cancelled:  # skip the rest of the job: XGROUP SETID $
                    s.group.last_delivered = s.last_id
            if job:
                self.ended[stream] = ("e" if cancelled else "n", job)
            self.cancels.pop(stream, None)
            if lock_cap_ms > 0 and lock is not None:
                lock.expires_at_ms = self.clock() + lock_cap_ms
            if keep_ms > 0 and s is not None:
                s.expires_at_ms = self.clock() + keep_ms
        return sealed

    async def lock_and_cancel(self, stream: str) -> tuple[str | None, str | None]:
        return await self.lock_holder(stream), self.cancels.get(stream)

    async def lock_and_ended(self, stream: str) -> tuple[str | None, str | None]:
        ended = self.ended.get(stream)
        return await self.lock_holder(stream), None if ended is None else ended[1]

    async def lock_holder(self, stream: str) -> str | None:
        """GET of the lock key: the token holding it, or None."""
        await self._enter("lock_holder", stream)
        lock = self._live_lock(self.keys.lock(stream))
        await self._leave("lock_holder")
        return None if lock is None else lock.token

    async def lock_exists(self, stream: str) -> bool:
        await self._enter("lock_exists", stream)
        exists = self._live_lock(self.keys.lock(stream)) is not None
        await self._leave("lock_exists")
        return exists

    async def is_end_marker(self, stream: str, entry_id: str) -> bool:
        await self._enter("is_end_marker", stream, entry_id)
        s = self._data_stream(stream)
        fields = None if s is None else s.entries.get(entry_id)
        await self._leave("is_end_marker")
        return fields is not None and is_eos({k: str(v) for k, v in fields.items()})

    async def sweep_leases(
        self, horizon_ms: int, limit: int, recheck_ms: int
    ) -> list[tuple[str, int]]:
        """sweep.lua: members due before now + horizon (by score, then member), pushed
        ``recheck_ms`` into the future."""
        await self._enter("sweep_leases", horizon_ms, limit, recheck_ms)
        now = self.clock()
        due = sorted(
            ((score, member) for member, score in self._leases.items() if score <= now + horizon_ms)
        )[:limit]
        for _, member in due:
            self._leases[member] = float(now + recheck_ms)
        await self._leave("sweep_leases")
        return [(member, int(score)) for score, member in due]

    async def touch_session(self, consumer: str, value: str, ttl_ms: int) -> None:
        await self._enter("touch_session", consumer)
        self.sessions[consumer] = value
        await self._leave("touch_session")

    async def end_session(self, consumer: str) -> None:
        await self._enter("end_session", consumer)
        self.sessions.pop(consumer, None)
        await self._leave("end_session")

    async def session(
        self, mode: SessionMode, consumer: str, value: str, ttl_ms: int, incarnation: str
    ) -> bool:
        """session.lua, without expiry (the fake's sessions live until ended)."""
        await self._enter("session", mode, consumer)
        held = self.sessions.get(consumer)
        ok = True
        if mode == "create":
            self.sessions[consumer] = value
        elif mode == "forget":
            ok = held is None or incarnation_of(held) != incarnation
        elif held != value:
            ok = False
        elif mode == "end":
            del self.sessions[consumer]
        await self._leave("session")
        return ok

    async def session_alive(
        self, consumer: str, incarnation: str, service: str | None = None
    ) -> bool:
        await self._enter("session_alive", consumer)
        sessions = self.sessions
        if service is not None and service != self.keys.service:
            other = self.other_services.get(service)
            sessions = {} if other is None else other.sessions
        alive = incarnation_of(sessions.get(consumer)) == incarnation
        await self._leave("session_alive")
        return alive

    async def lock_alive(self, stream: str) -> bool:
        return (await self.lock_state(stream))[0]

    async def lock_state(self, stream: str) -> tuple[bool, str | None]:
        holder = await self.lock_holder(stream)
        if holder is None:
            return False, None
        parsed = parse_session_token(holder)
        if parsed is None or await self.session_alive(
            parsed.consumer, parsed.incarnation, parsed.service
        ):
            return True, None
        return False, holder

    async def next_due_ms(self) -> int | None:
        """next_due.lua over the fake's lease index (it keeps no session index)."""
        await self._enter("next_due_ms")
        now = self.clock()
        due = None if not self._leases else max(0, int(min(self._leases.values()) - now))
        await self._leave("next_due_ms")
        return due

    async def sweep_sessions(self, limit: int, recheck_ms: int) -> list[tuple[str, int]]:
        """The fake keeps no session index: no session is ever due."""
        await self._enter("sweep_sessions", limit, recheck_ms)
        await self._leave("sweep_sessions")
        return []

    async def unblock(self, client_id: int) -> bool:
        """CLIENT UNBLOCK: the fake has no blocked connections (no waiter runs on it)."""
        await self._enter("unblock", client_id)
        await self._leave("unblock")
        return False

    async def take_scan_lease(self, owner: str, ttl_ms: int) -> bool:
        """SET NX PX of the scan lease."""
        await self._enter("take_scan_lease", owner, ttl_ms)
        now = self.clock()
        taken = self._scan_lease is None or self._scan_lease[1] <= now
        if taken:
            self._scan_lease = (owner, now + ttl_ms)
        await self._leave("take_scan_lease")
        return taken

    async def scan_cursor(self) -> str:
        await self._enter("scan_cursor")
        await self._leave("scan_cursor")
        return self._scan_cursor

    async def save_scan_cursor(self, cursor: str) -> None:
        await self._enter("save_scan_cursor", cursor)
        self._scan_cursor = cursor
        await self._leave("save_scan_cursor")

    async def prune_consumers(self, min_idle_ms: int, keep: str) -> list[str]:
        """prune_consumers.lua; the fake keeps no consumer names, so none is pruned
        (the script is tested against real Redis)."""
        await self._enter("prune_consumers", min_idle_ms, keep)
        await self._leave("prune_consumers")
        return []

    # -- internals -------------------------------------------------------------------------

    async def _enter(self, method: str, *args: Any) -> None:
        """Record the call; the send checkpoint; a fault or gate placed before the effect."""
        self.calls.append(Call(method, args))
        await anyio.lowlevel.checkpoint()
        fault = self._faults.get(method)
        if fault is not None and not fault.after and fault.times > 0:
            fault.times -= 1
            raise fault.error or RedisUnavailable(f"fake: {method} failed before running")
        gate = self._gates.get(method)
        if gate is not None and not gate.after:
            await gate.pass_through()

    async def _leave(self, method: str) -> None:
        """A fault or gate placed after the effect (the reply is lost or late)."""
        fault = self._faults.get(method)
        if fault is not None and fault.after and fault.times > 0:
            fault.times -= 1
            raise fault.error or RedisUnavailable(f"fake: {method} ran but its reply was lost")
        gate = self._gates.get(method)
        if gate is not None and gate.after:
            await gate.pass_through()
        self.last_ok = time.monotonic()

    def _indexed_name(self, assignment_id: str) -> str | None:
        """The stream an LBS entry names, if the active-assignment index points at it."""
        src = self._lbs.entries.get(assignment_id)
        raw = None if src is None else src.get(STREAM_FIELD)
        if raw is None:
            return None
        name = text(raw)
        return name if self._active.get(name) == assignment_id else None

    def _live_lock(self, key: str) -> _Lock | None:
        lock = self._locks.get(key)
        if (
            lock is not None
            and lock.expires_at_ms is not None
            and lock.expires_at_ms <= self.clock()
        ):
            del self._locks[key]
            return None
        return lock

    def _data_stream(self, stream: str) -> _Stream | None:
        s = self._data.get(stream)
        if s is not None and s.expires_at_ms is not None and s.expires_at_ms <= self.clock():
            del self._data[stream]
            return None
        return s

    def _xadd(self, s: _Stream, fields: dict[str, bytes | str]) -> str:
        now = self.clock()
        sid = (now, 0) if now > s.last_id[0] else (s.last_id[0], s.last_id[1] + 1)
        s.last_id = sid
        entry_id = format_id(sid)
        s.entries[entry_id] = fields
        return entry_id

    def _xadd_lbs(self, fields: dict[str, bytes | str]) -> str:
        entry_id = self._xadd(self._lbs, fields)
        self.lbs_history.append((entry_id, dict(fields)))
        self._lbs_changed.notify()
        return entry_id

    def _xadd_dlq(self, fields: dict[str, bytes | str]) -> tuple[str, int]:
        before = len(self._dlq.entries)
        entry_id = self._xadd(self._dlq, fields)
        if self.dlq_maxlen > 0:
            while len(self._dlq.entries) > self.dlq_maxlen:
                del self._dlq.entries[next(iter(self._dlq.entries))]
        return entry_id, before + 1 - len(self._dlq.entries)

    def _xack_lbs(self, entry_id: str) -> bool:
        group = self._lbs.group
        return group is not None and group.pel.pop(entry_id, None) is not None

    def _deliver_new(
        self, s: _Stream, group: _Group, consumer: str, count: int
    ) -> list[tuple[str, dict[str, bytes | str]]]:
        """XREADGROUP ``>``: up to ``count`` entries after the last delivered one."""
        now = self.clock()
        out: list[tuple[str, dict[str, bytes | str]]] = []
        for entry_id, fields in _newer(s, group.last_delivered):
            if len(out) >= count:
                break
            group.pel[entry_id] = _Delivery(consumer, now)
            group.last_delivered = parse_id(entry_id)
            out.append((entry_id, fields))
        return out


def _newer(s: _Stream, after: StreamId) -> Iterator[tuple[str, dict[str, bytes | str]]]:
    for entry_id, fields in s.entries.items():
        if parse_id(entry_id) > after:
            yield entry_id, fields


def _by_id(item: tuple[str, object]) -> StreamId:
    return parse_id(item[0])


def _decode(fields: Mapping[str, bytes | str]) -> dict[str, str]:
    return {k: text(v) for k, v in fields.items()}


__all__ = ["METHODS", "Call", "FakeGateway", "Gate", "ManualClock", "format_id", "parse_id"]


class RawFieldsView:
    """``gateway`` as a consumer in bytes mode sees it (``Gateway.raw_fields``): data
    entries' fields come back as bytes. Everything else is ``gateway`` itself."""

    raw_fields = True

    def __init__(self, gateway: FakeGateway) -> None:
        self._gateway = gateway

    # Its command groups are the view itself, so that reads through them are in bytes.
    @property
    def assignments(self) -> RawFieldsView:
        return self

    @property
    def streams(self) -> RawFieldsView:
        return self

    @property
    def completion(self) -> RawFieldsView:
        return self

    @property
    def liveness(self) -> RawFieldsView:
        return self

    def __getattr__(self, name: str) -> Any:
        return getattr(self._gateway, name)

    async def fenced_read(self, *args: Any, **kwargs: Any) -> ReadReply:
        return _in_bytes(await self._gateway.fenced_read(*args, **kwargs))

    async def acquire_and_read(self, *args: Any, **kwargs: Any) -> tuple[int, ReadReply | None]:
        taken, reply = await self._gateway.acquire_and_read(*args, **kwargs)
        return taken, None if reply is None else _in_bytes(reply)


def _in_bytes(reply: ReadReply) -> ReadReply:
    if not reply.entries:
        return reply
    entries = [(i, {k.encode(): v.encode() for k, v in f.items()}) for i, f in reply.entries]
    return reply._replace(entries=entries)
