"""The shared-group part of the soak (``--group-workers``): ``GroupConsumer`` worker
processes (``tests.soak.worker:GroupSoakWorker``) share a few streams in one consumer
group, under the same faults as the ``StreamConsumer`` fleet (the fault picker
chooses its victims among both fleets), while a producer appends entries to those
streams with plain ``XADD``.

The service is the soak's own name plus ``-g``, so its consumer group, members and
dead letters are apart from the assignment machinery's.

Checks, after the drain and the graceful stop (docs/shared-groups.md):

* **group_lost**: every entry produced was handled (a call for it returned ``ok``),
  or it is a poison entry and sits in the dead-letter stream.
* **group_dead_letters**: every poison entry was dead-lettered exactly once, as
  ``handler_failed``, with its origin stream and id; nothing else was.
* **group_overlap**: no entry was handed to a second consumer while the first one's
  call was still running, unless the first consumer could have been declared dead
  in between: SIGSTOPped, killed or terminated, or a server fault (a restart, a
  primary kill) fell between the two calls. A slow live consumer keeps its entries.
* **group_left_behind**: no entry is pending in the group, every entry was
  delivered, no member is alive once the fleet stopped (a member of a worker killed
  just before the end is given its session TTL to run out), no restart counter is left.

Reported without failing: duplicates (an entry handled twice in sequence: its
consumer died after the work and before the acknowledgement), calls by status,
excused overlaps, producer write errors.
"""

from __future__ import annotations

import random
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio

from streamjobs._keys import Keys

from .produce import ProducerError
from .worker import ENTER, EXIT, OK

TARGET = "tests.soak.worker:GroupSoakWorker"

POISON_RATE = 0.01
FLAKY_RATE = 0.03
_FIND_DEPTH = 500
"""How far back the producer looks for an entry whose write failed (it writes one at
a time, so the entry, if the server took it, is among the newest)."""
_GIVE_UP_S = 60.0


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass(frozen=True)
class Produced:
    seq: int
    stream: str
    entry_id: str
    kind: str  # "", "poison" or "flaky"


class GroupProducer:
    """Appends ``rate`` entries per second to the group streams, each exactly once: a
    write that fails is looked for before it is written again (its reply may have
    been lost after the server applied it)."""

    def __init__(
        self, client: Any, streams: Sequence[str], rate: float, work_ms: int, rng: random.Random
    ) -> None:
        self.client = client
        self.streams = list(streams)
        self.rate = rate
        self.work_ms = work_ms
        self.rng = rng
        self.produced: list[Produced] = []
        self.errors: Counter[str] = Counter()
        self.confirmed_after_error = 0

    async def run(self, stop_at: float) -> None:
        seq = 0
        pause = 1.0 / self.rate
        while time.monotonic() < stop_at:
            seq += 1
            roll = self.rng.random()
            kind = (
                "poison"
                if roll < POISON_RATE
                else "flaky"
                if roll < POISON_RATE + FLAKY_RATE
                else ""
            )
            fields = {"seq": str(seq), "work_ms": str(self.work_ms)}
            if kind:
                fields[kind] = "1"
            stream = self.rng.choice(self.streams)
            entry_id = await self._append(stream, fields)
            self.produced.append(Produced(seq, stream, entry_id, kind))
            await anyio.sleep(pause)

    async def _append(self, stream: str, fields: dict[str, str]) -> str:
        give_up_at = time.monotonic() + _GIVE_UP_S
        while True:
            try:
                return _s(await self.client.xadd(stream, fields))
            except Exception as exc:
                self.errors[type(exc).__name__] += 1
                last = f"{type(exc).__name__}: {exc}"
            while True:  # did the server take it? Ask until it answers.
                if time.monotonic() > give_up_at:
                    raise ProducerError(f"group stream {stream}: no write for 60 s ({last})")
                await anyio.sleep(0.2)
                try:
                    found = await self._find(stream, fields["seq"])
                except Exception as exc:
                    last = f"{type(exc).__name__}: {exc}"
                    continue
                break
            if found is not None:
                self.confirmed_after_error += 1
                return found

    async def _find(self, stream: str, seq: str) -> str | None:
        for entry_id, fields in await self.client.xrevrange(stream, count=_FIND_DEPTH):
            if _s(fields.get(b"seq", b"")) == seq:
                return _s(entry_id)
        return None


@dataclass
class GroupCall:
    consumer: str
    stream: str
    entry_id: str
    enter_ns: int
    exit_ns: int | None = None
    status: str = ""


def parse_calls(records: Iterable[str]) -> list[GroupCall]:
    """The ``handle()`` calls of the group workers' records (``worker.group_record``),
    each enter matched with its exit (a call without one was killed or is stuck)."""
    calls: list[GroupCall] = []
    open_calls: dict[tuple[str, str, str], GroupCall] = {}
    for rec in records:
        kind, consumer, stream, entry_id, _seq, t_ns, status = rec.split("|")
        key = (consumer, stream, entry_id)
        if kind == ENTER:
            call = GroupCall(consumer, stream, entry_id, int(t_ns))
            calls.append(call)
            open_calls[key] = call
        elif kind == EXIT:
            found = open_calls.pop(key, None)
            if found is not None:
                found.exit_ns, found.status = int(t_ns), status
    return calls


@dataclass
class GroupState:
    """What the group checks read at the end."""

    calls: list[GroupCall]
    dead_letters: list[dict[str, str]]
    pending: dict[str, int]
    undelivered: dict[str, str]  # stream -> "last delivered .. newest" where they differ
    live_members: list[str]
    restart_counters: list[str]


@dataclass
class Windows:
    """When each consumer could have been declared dead without being so: its
    SIGSTOPs, and its end (kill -9 or SIGTERM) onwards; and the server faults."""

    stops: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    ends: dict[str, int] = field(default_factory=dict)
    server_faults: list[tuple[int, int]] = field(default_factory=list)

    def excused(self, consumer: str, start_ns: int, end_ns: int) -> bool:
        """Could ``consumer`` have lost its session between the two times?"""
        if any(a < end_ns and b > start_ns for a, b in self.stops.get(consumer, [])):
            return True
        if self.ends.get(consumer, 2**62) <= end_ns:
            return True
        return any(a < end_ns and b > start_ns for a, b in self.server_faults)


@dataclass
class GroupReport:
    lines: list[str]
    failures: list[str]
    failed: list[str]


def check_groups(produced: Sequence[Produced], state: GroupState, windows: Windows) -> GroupReport:
    failures: list[str] = []
    failed: list[str] = []
    ok = {(c.stream, c.entry_id) for c in state.calls if c.status == OK}
    dead: Counter[tuple[str, str]] = Counter()
    wrong_dead: list[str] = []
    for letter in state.dead_letters:
        key = (letter.get("_source_stream", ""), letter.get("_source_id", ""))
        dead[key] += 1
    kinds = {(p.stream, p.entry_id): p.kind for p in produced}
    for key, count in dead.items():
        if kinds.get(key) != "poison":
            wrong_dead.append(f"{key[0]} {key[1]} (a {kinds.get(key) or 'plain'} entry)")
        elif count > 1:
            wrong_dead.append(f"{key[0]} {key[1]} dead-lettered {count} times")
    reasons = Counter(letter.get("_dlq_reason", "?") for letter in state.dead_letters)
    if set(reasons) - {"handler_failed"}:
        wrong_dead.append(f"reasons {dict(reasons)} (only handler_failed expected)")
    lost = [
        p
        for p in produced
        if (p.stream, p.entry_id) not in ok
        and not (p.kind == "poison" and dead[(p.stream, p.entry_id)])
    ]
    if lost:
        failed.append("group_lost")
        failures.append(
            f"group: {len(lost)} entries neither handled nor dead-lettered, e.g. "
            + ", ".join(f"{p.stream} {p.entry_id} (seq {p.seq})" for p in lost[:5])
        )
    if wrong_dead:
        failed.append("group_dead_letters")
        failures.append(f"group: wrong dead letters: {'; '.join(wrong_dead[:5])}")

    by_entry: dict[tuple[str, str], list[GroupCall]] = defaultdict(list)
    for call in state.calls:
        by_entry[(call.stream, call.entry_id)].append(call)
    overlaps: list[str] = []
    excused = 0
    duplicates = 0
    for key, calls in by_entry.items():
        consumers = {c.consumer for c in calls}
        if len(consumers) > 1 and sum(1 for c in calls if c.status == OK) > 1:
            duplicates += 1
        calls.sort(key=lambda c: c.enter_ns)
        for i, later in enumerate(calls):
            for earlier in calls[:i]:
                if earlier.consumer == later.consumer:
                    continue
                running = earlier.exit_ns is None or earlier.exit_ns > later.enter_ns
                if not running:
                    continue
                if windows.excused(earlier.consumer, earlier.enter_ns, later.enter_ns):
                    excused += 1
                else:
                    overlaps.append(
                        f"{key[0]} {key[1]}: {later.consumer} began while {earlier.consumer}'s "
                        "call was running, and nothing could have declared it dead"
                    )
    if overlaps:
        failed.append("group_overlap")
        failures.append(f"group: {len(overlaps)} overlapping calls: {'; '.join(overlaps[:3])}")

    left = (
        [f"{s}: {n} pending" for s, n in state.pending.items() if n]
        + [f"{s}: not delivered up to its newest entry ({d})" for s, d in state.undelivered.items()]
        + [f"member {m} still alive" for m in state.live_members]
        + [f"restart counters {k}" for k in state.restart_counters]
    )
    if left:
        failed.append("group_left_behind")
        failures.append(f"group: left behind: {'; '.join(left[:5])}")

    statuses = Counter(c.status or "no exit" for c in state.calls)
    produced_kinds = Counter(p.kind or "plain" for p in produced)
    lines = [
        f"{'group entries':<17}  {len(produced)} produced ({dict(produced_kinds)}); handled "
        f"{len(ok)}; calls {len(state.calls)} {dict(statuses)}; handled by two consumers "
        f"{duplicates}",
        f"{'group checks':<17}  lost {len(lost)}, wrong dead letters {len(wrong_dead)}, "
        f"dead letters {dict(reasons) or 0}, overlapping calls {len(overlaps)} (excused "
        f"{excused}), left behind {len(left)}",
    ]
    return GroupReport(lines, failures, failed)


async def collect_groups(
    client: Any, service: str, streams: Sequence[str], records: Iterable[str]
) -> GroupState:
    keys = Keys(service)
    pending: dict[str, int] = {}
    undelivered: dict[str, str] = {}
    live: list[str] = []
    counters: list[str] = []
    seconds, micros = await client.time()
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    for stream in streams:
        if not await client.exists(stream):
            continue
        newest = _s((await client.xinfo_stream(stream))["last-generated-id"])
        for group in await client.xinfo_groups(stream):
            if _s(group["name"]) != service:
                continue
            pending[stream] = int(group["pending"])
            delivered = _s(group["last-delivered-id"])
            if delivered != newest:
                undelivered[stream] = f"{delivered} .. {newest}"
        live += await _alive(client, keys, stream, now_ms)
        if await client.exists(keys.starts(stream)):
            counters.append(keys.starts(stream))
    letters = [
        {_s(k): _s(v) for k, v in fields.items()}
        for _, fields in await client.xrange(keys.dead_letters)
    ]
    return GroupState(
        calls=parse_calls(records),
        dead_letters=letters,
        pending=pending,
        undelivered=undelivered,
        live_members=live,
        restart_counters=counters,
    )


async def _alive(client: Any, keys: Keys, stream: str, now_ms: int) -> list[str]:
    members = await client.zrange(keys.members(stream), 0, -1, withscores=True)
    return [f"{_s(m)} on {stream}" for m, deadline in members if float(deadline) > now_ms]


async def until_no_member_alive(
    client: Any, service: str, streams: Sequence[str], within_s: float
) -> None:
    """Poll until no member of the group is alive, for at most ``within_s``: once the
    fleet stopped, a member of a worker SIGKILLed just before stays alive until its
    session TTL runs out (a stopped one leaves at once)."""
    keys = Keys(service)
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        seconds, micros = await client.time()
        now_ms = int(seconds) * 1000 + int(micros) // 1000
        if not [m for stream in streams for m in await _alive(client, keys, stream, now_ms)]:
            return
        await anyio.sleep(0.1)


async def drained(client: Any, service: str, streams: Sequence[str]) -> str | None:
    """None once every group stream is delivered up to its newest entry and nothing
    is pending; else what is not."""
    for stream in streams:
        if not await client.exists(stream):
            continue
        newest = _s((await client.xinfo_stream(stream))["last-generated-id"])
        groups = [g for g in await client.xinfo_groups(stream) if _s(g["name"]) == service]
        if not groups:
            return f"{stream}: no group yet"
        group = groups[0]
        delivered = _s(group["last-delivered-id"])
        if int(group["pending"]) or delivered != newest:
            return f"{stream}: {group['pending']} pending, delivered {delivered} of {newest}"
    return None
