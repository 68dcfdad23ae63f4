"""The soak's producer: jobs at a steady rate, every write exactly once.

It keeps ``open_streams`` jobs open; each tick (``1 / rate`` seconds) it takes the next
step of a random open job: append its next entry, close it (``close_stream()``) once it
holds ``entries_per_stream`` entries, or, for the jobs chosen to end early, cancel it
(``cancel_stream()``) or append its ``finish=1`` entry. A job that ended early may
then get a few more entries (its *tail*: they belong to the ended job and must never
be handled), and may or may not be closed. A new job is opened (``add_stream()``) in
the place of each one the producer is through with.

**Jobs and names.** Every job gets a soak-wide number ``n``: its ``info`` is
``{"job": n, "work_ms": ...}`` and each of its entries carries ``job=n`` (and
``seq``, its position in the job). Stream names come from a bounded pool (with
``reuse`` in the mix), so a name is used again by a later job once the producer is
through with its previous one. That previous job may not have finished yet: then
``add_stream()`` deduplicates (it returns the unfinished job's assignment). The
producer tells the two apart by looking for an assignment (queued, pending, re-queued
or dead-lettered) whose ``info`` names job ``n``; if there is none, the call was
deduplicated: no job was started, and the name rests a moment while another is tried.
A job's entries are appended only after its ``add_stream()`` returned.

**Exactly once.** Writes go through :class:`streamjobs.Producer` on a client that
never re-sends a command. When a write fails its outcome is unknown (the reply may
have been lost after the server applied it), so before writing again the producer
reads back whether it landed: an entry with this job and ``seq`` (not a replayed copy)
after the job's previous entry, an end marker there, or an assignment of job ``n``.
That makes every entry exist once, so "produced" is exact, and a duplicated
assignment cannot happen. A cancel is simply repeated (it is idempotent).
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

import anyio

from streamjobs import CancelOutcome, InvalidStreamName, Producer
from streamjobs._keys import Keys

from .history import FINISH, FLAKY, POISON, REJECT, TAIL, JobRecord

WRITE_TIMEOUT_S: Final = 90.0
_PAD: Final = "x" * 48
_LOOKBACK: Final = 1000  # entries read back after a failed append (see _find_entry)
T = TypeVar("T")

# What a job does at its end point.
CLOSE: Final = "close"  # entries_per_stream entries, then close_stream()
CANCEL: Final = "cancel"  # cancel_stream() after end_at entries
EARLY_FINISH: Final = "finish"  # the entry with seq end_at carries finish=1

# The producer's part of the mix (``--mix``); "reject" is the producer's too (the
# replays are the runner's).
MIX_CANCEL: Final = "cancel"
MIX_FINISH: Final = "finish"
MIX_REJECT: Final = "reject"
MIX_REUSE: Final = "reuse"
ALL_MIX: Final = (MIX_CANCEL, MIX_FINISH, MIX_REJECT, MIX_REUSE)


class ProducerError(RuntimeError):
    """A write could not be completed within :data:`WRITE_TIMEOUT_S`."""


@dataclass
class Job:
    """One job the producer started: its name, plan and what it wrote."""

    n: int
    name: str
    fate: str  # CLOSE, CANCEL or EARLY_FINISH
    end_at: int  # CANCEL: entries before the cancel; EARLY_FINISH: seq of the finish entry
    tail: int = 0  # entries to append after an early end
    close_after: bool = True  # close_stream() once through (always for CLOSE)
    reused: bool = False  # its name had an earlier job
    assignment_id: str = ""
    floor_id: str = "0-0"  # the stream's newest entry id when the job began
    entries: list[tuple[str, int, str]] = field(default_factory=list)  # (id, seq, kind)
    cancel_outcome: str = ""  # a CancelOutcome value, once cancelled
    cancel_reason: str = ""
    finish_id: str = ""  # the entry with finish=1
    closed: bool = False
    eos_id: str = ""
    done: bool = False  # the producer is through with it (its name is free again)

    @property
    def last_id(self) -> str:
        return self.entries[-1][0] if self.entries else self.floor_id

    @property
    def ended(self) -> bool:
        """Its end point passed: cancelled, or its finish entry appended."""
        return bool(self.cancel_outcome or self.finish_id)

    def record(self) -> JobRecord:
        """The job as the history checks see it."""
        return JobRecord(
            n=self.n,
            stream=self.name,
            entries=tuple((eid, kind) for eid, _, kind in self.entries),
            cancelled=bool(self.cancel_outcome),
            finish_id=self.finish_id,
        )


@dataclass(frozen=True)
class ProducePlan:
    service: str
    run_id: str
    rate: float
    open_streams: int
    entries_per_stream: int
    work_ms: int
    poison_rate: float
    flaky_rate: float
    reject_rate: float = 0.0
    cancel_rate: float = 0.0  # share of jobs cancelled
    finish_rate: float = 0.0  # share of jobs finished early
    name_pool: int = 0  # 0: a new name for every job (no reuse)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _job_of(fields: dict[bytes, bytes]) -> str:
    """The job an assignment entry's ``info`` names ('' if none or unreadable)."""
    try:
        info = json.loads(fields.get(b"info", b"{}"))
    except ValueError:
        return ""
    return str(info.get("job", "")) if isinstance(info, dict) else ""


class StreamProducer:
    def __init__(self, client: Any, plan: ProducePlan, rng: random.Random) -> None:
        self.client = client
        self.plan = plan
        self.rng = rng
        self.keys = Keys(plan.service)
        self.producer = Producer(client, service=plan.service)
        self.jobs: dict[int, Job] = {}
        self.errors: Counter[str] = Counter()
        self.error_samples: dict[str, str] = {}
        self.confirmed_after_error = 0  # failed writes that had landed after all
        self.entries = 0
        self.deduplicated = 0  # add_stream() answered an earlier, unfinished job
        self.dedup_same_id = 0  # ... with that job's own first assignment id
        self._next_job = 0
        self._next_name = 0
        # Name pool: name -> when it may be used again (monotonic); names in use are out.
        self._free: dict[str, float] = {}
        self._released: list[str] = []  # free names, most recently released last
        self._last_job: dict[str, Job] = {}  # name -> its latest job

    @property
    def open_count(self) -> int:
        return sum(1 for j in self.jobs.values() if not j.done)

    @property
    def names(self) -> set[str]:
        return {j.name for j in self.jobs.values()}

    def records(self) -> list[JobRecord]:
        return [j.record() for j in self.jobs.values()]

    # -- the loop ------------------------------------------------------------------------

    async def run(self, stop_at: float) -> None:
        """Produce until the monotonic time ``stop_at``, then close every open job."""
        plan = self.plan
        period = 1.0 / plan.rate
        opened: list[Job] = []
        next_t = time.monotonic()
        while time.monotonic() < stop_at:
            await self._fill(opened)
            if opened:
                job = self.rng.choice(opened)
                await self._step(job)
                if job.done:
                    opened.remove(job)
                    self._release(job.name)
            next_t += period
            now = time.monotonic()
            if next_t < now - 1.0:  # fell behind (an outage): do not burst to catch up
                next_t = now
            await anyio.sleep(max(0.0, next_t - now))
        for job in opened:
            await self._wind_up(job)

    async def _fill(self, opened: list[Job]) -> None:
        """Open jobs until ``open_streams`` are open (or no name is free now)."""
        tries = 0
        while len(opened) < self.plan.open_streams and tries < 4:
            name = self._pick_name()
            if name is None:
                return
            job = await self._open(name)
            if job is None:
                tries += 1
                continue
            opened.append(job)

    def _pick_name(self) -> str | None:
        if not self.plan.name_pool:
            name = f"soak-{self.plan.run_id}-{self._next_name:05d}"
            self._next_name += 1
            return name
        while self._next_name < self.plan.name_pool:  # the pool fills up first
            name = f"soak-{self.plan.run_id}-n{self._next_name:03d}"
            self._next_name += 1
            self._free[name] = 0.0
            self._released.append(name)
        now = time.monotonic()
        ready = [n for n in self._released if self._free[n] <= now]
        if not ready:
            return None
        # A third of the time the name freed last: its previous job is likely still
        # running (add_stream deduplicates), or just ended; else any free name.
        name = ready[-1] if self.rng.random() < 1 / 3 else self.rng.choice(ready)
        self._released.remove(name)
        del self._free[name]
        return name

    def _release(self, name: str, rest_s: float = 0.0) -> None:
        if self.plan.name_pool:
            self._free[name] = time.monotonic() + rest_s
            self._released.append(name)

    def _plan_job(self, n: int, name: str) -> Job:
        plan, rng = self.plan, self.rng
        roll = rng.random()
        fate, end_at = CLOSE, plan.entries_per_stream
        if roll < plan.cancel_rate:
            fate, end_at = CANCEL, rng.randrange(plan.entries_per_stream)
        elif roll < plan.cancel_rate + plan.finish_rate:
            fate, end_at = EARLY_FINISH, rng.randrange(plan.entries_per_stream)
        job = Job(n, name, fate, end_at, reused=name in self._last_job)
        if fate != CLOSE:
            job.tail = rng.choice((0, 0, 1, 2, 3))
            job.close_after = rng.random() < 0.5
        return job

    async def _open(self, name: str) -> Job | None:
        """Start a job on ``name``; None if add_stream() deduplicated (the name rests)."""
        n = self._next_job
        self._next_job += 1  # a number add_stream() deduplicated is never used again
        info = {"job": n, "work_ms": self.plan.work_ms}
        # Not read back after a failure but called again, as the Producer asks: a failed
        # call may not have skipped what followed the previous job's end yet (its
        # docstring). The idempotency key makes a repeat answer the first call's job,
        # even once that job has finished.
        assignment_id = await self._write(
            f"add_stream({name}) for job {n}",
            lambda: self.producer.add_stream(name, info, idempotency_key=f"soak-job-{n}"),
            _unknown,
        )
        if await self._read(f"the assignment of job {n}", self._find_assignment, name, n) is None:
            # No assignment names job n: the call returned an earlier job of the name
            # that has not finished yet.
            self.deduplicated += 1
            previous = self._last_job.get(name)
            if previous is not None and previous.assignment_id == assignment_id:
                self.dedup_same_id += 1
            self._release(name, rest_s=self.rng.uniform(0.5, 1.5))
            return None
        job = self._plan_job(n, name)
        job.assignment_id = assignment_id
        job.floor_id = await self._read(f"the newest entry of {name}", self._top, name)
        self.jobs[n] = job
        self._last_job[name] = job
        return job

    async def _step(self, job: Job) -> None:
        """One write for ``job`` (none if it only has to be marked done)."""
        if not job.ended:
            if job.fate == CANCEL and len(job.entries) == job.end_at:
                await self._cancel(job)
            elif job.fate == EARLY_FINISH and len(job.entries) == job.end_at:
                await self._append(job, FINISH)
            else:
                await self._append(job, self._roll_kind())
                if job.fate == CLOSE and len(job.entries) >= self.plan.entries_per_stream:
                    await self._close(job)
                    job.done = True
                    return
        elif self._tail_left(job):
            await self._append(job, TAIL)
        elif job.close_after and not job.closed:
            await self._close(job)
        if job.ended and not self._tail_left(job) and (job.closed or not job.close_after):
            job.done = True

    @staticmethod
    def _tail_left(job: Job) -> int:
        return job.tail - sum(1 for _, _, kind in job.entries if kind == TAIL)

    async def _wind_up(self, job: Job) -> None:
        """Production stops: a job not yet at its end point closes normally; one that
        ended early finishes its plan's close (its tail is cut short)."""
        if not job.ended:
            job.fate = CLOSE
            await self._close(job)
        elif job.close_after and not job.closed:
            await self._close(job)
        job.done = True

    def _roll_kind(self) -> str:
        plan = self.plan
        roll = self.rng.random()
        for kind, rate in ((POISON, plan.poison_rate), (FLAKY, plan.flaky_rate)):
            if roll < rate:
                return kind
            roll -= rate
        return REJECT if roll < plan.reject_rate else ""

    async def _append(self, job: Job, kind: str) -> None:
        seq = len(job.entries)
        fields = {"job": str(job.n), "seq": str(seq), "pad": _PAD}
        if kind:
            fields[kind] = "1"
        after = job.last_id
        entry_id = await self._write(
            f"append({job.name}, job {job.n} seq {seq})",
            lambda: self.producer.append(job.name, fields),
            lambda: self._find_entry(job.name, after, job.n, seq),
        )
        job.entries.append((entry_id, seq, kind))
        if kind == FINISH:
            job.finish_id = entry_id
        self.entries += 1

    async def _close(self, job: Job) -> None:
        after = job.last_id
        job.eos_id = await self._write(
            f"close_stream({job.name}) of job {job.n}",
            lambda: self.producer.close_stream(job.name),
            lambda: self._find_eos(job.name, after),
        )
        job.closed = True

    async def _cancel(self, job: Job) -> None:
        reason = "" if self.rng.random() < 0.5 else f"soak cancel of job {job.n}"
        outcome: CancelOutcome = await self._write(
            f"cancel_stream({job.name}) of job {job.n}",
            lambda: self.producer.cancel_stream(job.name, reason),
            _unknown,  # idempotent: just cancel again
        )
        job.cancel_reason = reason
        job.cancel_outcome = outcome.value

    # -- exactly-once writes ---------------------------------------------------------------

    async def _write(
        self,
        what: str,
        attempt: Callable[[], Awaitable[T]],
        landed: Callable[[], Awaitable[T | None]],
    ) -> T:
        """Run ``attempt``; after a failure, write again only if ``landed`` finds nothing."""
        deadline = time.monotonic() + WRITE_TIMEOUT_S
        delay = 0.05
        last_error = ""
        while True:
            try:
                return await attempt()
            except (TypeError, InvalidStreamName):
                raise  # a bug here, not a fault
            except Exception as exc:
                last_error = self._note(exc)
            while True:  # the outcome is unknown: find out
                if time.monotonic() > deadline:
                    raise ProducerError(
                        f"could not {what} within {WRITE_TIMEOUT_S:g}s: {last_error}"
                    )
                await anyio.sleep(delay)
                delay = min(delay * 2, 1.0)
                try:
                    found = await landed()
                    break
                except Exception as exc:
                    last_error = self._note(exc)
            if found is not None:
                self.confirmed_after_error += 1
                return found

    async def _read(self, what: str, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """A read the producer needs, retried through faults."""
        deadline = time.monotonic() + WRITE_TIMEOUT_S
        delay = 0.05
        while True:
            try:
                return await fn(*args)
            except Exception as exc:
                last_error = self._note(exc)
            if time.monotonic() > deadline:
                raise ProducerError(
                    f"could not read {what} within {WRITE_TIMEOUT_S:g}s: {last_error}"
                )
            await anyio.sleep(delay)
            delay = min(delay * 2, 1.0)

    def _note(self, exc: Exception) -> str:
        name = type(exc).__name__
        self.errors[name] += 1
        text = f"{name}: {exc}"
        self.error_samples.setdefault(name, text[:300])
        return text

    async def _top(self, name: str) -> str:
        reply = await self.client.xrevrange(name, count=1)
        return _text(reply[0][0]) if reply else "0-0"

    async def _find_entry(self, name: str, after: str, n: int, seq: int) -> str | None:
        """Job ``n``'s entry ``seq``, if it is in ``name`` after ``after``. Only this
        producer appends entries of job ``n``; a dead-letter replay appends copies (with
        ``_replayed_from``), which are not it."""
        reply = await self.client.xrevrange(name, max="+", min=f"({after}", count=_LOOKBACK)
        want_job, want_seq = str(n).encode(), str(seq).encode()
        for entry_id, fields in reply:
            if (
                fields.get(b"job") == want_job
                and fields.get(b"seq") == want_seq
                and b"_replayed_from" not in fields
            ):
                return _text(entry_id)
        return None

    async def _find_eos(self, name: str, after: str) -> str | None:
        """A plain end marker (not a cancel's) in ``name`` after ``after``."""
        reply = await self.client.xrevrange(name, max="+", min=f"({after}", count=_LOOKBACK)
        for entry_id, fields in reply:
            if b"_eos" in fields and b"_cancel" not in fields:
                return _text(entry_id)
        return None

    async def _find_assignment(self, name: str, n: int) -> str | None:
        """An assignment of job ``n`` on ``name``: queued, pending, re-queued (a copy
        keeps ``info``), or moved to the dead-letter stream by recovery."""
        wanted, job = name.encode(), str(n)
        for key in (self.keys.assignments, self.keys.dead_letters):
            for entry_id, fields in await self.client.xrange(key):
                if fields.get(b"stream") == wanted and _job_of(fields) == job:
                    return _text(entry_id)
        return None


async def _unknown() -> None:
    return None
