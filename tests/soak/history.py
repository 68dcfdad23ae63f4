"""The soak's history checks: pure functions over the records the workers pushed.

The records are described in :mod:`tests.soak.worker`; the rules checked here (exclusive
ownership with the one allowed exception, order within an episode, what counts as
lost, foreign entries, a finished job started again) are stated in the package
docstring (:mod:`tests.soak`). Nothing here does I/O, so the rules are unit-tested on
hand-made histories (``tests/unit/test_soak_history.py``).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field

from .worker import CANCELLED, END, ENTER, EXIT, LOST, OK, START

StreamId = tuple[int, int]
EntryKey = tuple[str, str]  # (stream, entry id)

# Kinds of produced entries (the field the producer sets to 1; '' for a plain entry).
POISON = "poison"  # always raises: dead-lettered as handler_failed
FLAKY = "flaky"  # raises on its first attempt
REJECT = "reject"  # raises DeadLetter unless replayed: dead-lettered as rejected, replayed
FINISH = "finish"  # the handler calls finish(stream) after it: its job ends early
TAIL = "tail"  # appended after its job's end point (a cancel, a finish entry)


def parse_id(entry_id: str) -> StreamId:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


@dataclass(slots=True)
class Call:
    """One handle() call: its enter record and, if it was pushed, its exit record."""

    consumer: str
    episode: str
    stream: str
    entry_id: str
    attempt: int
    enter_ns: int
    exit_ns: int | None = None
    status: str | None = None  # None: no exit record (the process died mid-call)
    end_ns: int = 0  # exit_ns, or when the process ended; set by History.resolve()
    entry_job: str = ""  # the entry's job field
    info_job: str = ""  # message.info["job"]: the job it was handed to
    replayed_from: str = ""  # a replayed copy: the id the entry had when dead-lettered

    @property
    def origin(self) -> EntryKey:
        """The produced entry this call is about (a replayed copy counts for its original)."""
        return self.stream, self.replayed_from or self.entry_id

    @property
    def foreign(self) -> bool:
        """The entry was handed to a job it does not belong to."""
        return self.entry_job != self.info_job

    def describe(self) -> str:
        end = "no exit" if self.exit_ns is None else f"{self.status}"
        return (
            f"{self.consumer} [{self.episode}] {self.stream} {self.entry_id} "
            f"attempt {self.attempt} ({end})"
        )


@dataclass(slots=True)
class Episode:
    """What one consumer did with one stream after one on_stream_start()."""

    id: str
    consumer: str
    stream: str
    start_ns: int | None = None  # the S record; None if it is missing
    calls: list[Call] = field(default_factory=list)  # in enter order
    lost: bool = False
    ended: bool = False
    ended_ns: int | None = None  # the F record (on_stream_end), or the C record
    cancelled: bool = False  # the C record (on_stream_cancelled)
    job: str = ""  # the job of its assignment (the S record's info_job)

    @property
    def begin_ns(self) -> int:
        if self.start_ns is not None:
            return self.start_ns
        return self.calls[0].enter_ns if self.calls else 0


@dataclass
class History:
    calls: list[Call]
    episodes: dict[str, Episode]
    unmatched_exits: int = 0  # exit records without an enter record (should be 0)

    def resolve(self, process_end_ns: Mapping[str, int], fallback_end_ns: int) -> None:
        """Give every call without an exit record the end time of its process."""
        for call in self.calls:
            if call.exit_ns is not None:
                call.end_ns = call.exit_ns
            else:
                call.end_ns = process_end_ns.get(call.consumer, fallback_end_ns)

    def handled(self) -> Counter[tuple[str, str]]:
        """(stream, entry id) -> number of handle() calls for it that returned."""
        return Counter((c.stream, c.entry_id) for c in self.calls if c.status == OK)

    def handled_origins(self) -> Counter[EntryKey]:
        """Like :meth:`handled`, with a replayed copy counted for its original entry."""
        return Counter(c.origin for c in self.calls if c.status == OK)

    def by_stream(self) -> dict[str, list[Call]]:
        out: dict[str, list[Call]] = defaultdict(list)
        for call in self.calls:
            out[call.stream].append(call)
        for calls in out.values():
            calls.sort(key=lambda c: c.enter_ns)
        return out


def parse(records: Iterable[str]) -> History:
    """Build the history from raw records (see :mod:`tests.soak.worker` for the format)."""
    calls: list[Call] = []
    episodes: dict[str, Episode] = {}
    open_calls: dict[tuple[str, str, str, int], list[Call]] = defaultdict(list)
    unmatched = 0

    def episode_of(eid: str, consumer: str, stream: str) -> Episode:
        ep = episodes.get(eid)
        if ep is None:
            ep = episodes[eid] = Episode(eid, consumer, stream)
        return ep

    for raw in records:
        parts = raw.split("|")
        kind, consumer, eid, stream, entry_id, attempt_s, t_s, status = parts[:8]
        entry_job, info_job, replayed_from = [*parts[8:11], "", "", ""][:3]
        t_ns = int(t_s)
        ep = episode_of(eid, consumer, stream)
        if kind == START:
            ep.start_ns = t_ns
            ep.job = info_job
        elif kind == LOST:
            ep.lost = True
        elif kind in (END, CANCELLED):
            ep.ended = True
            ep.ended_ns = t_ns
            ep.cancelled = kind == CANCELLED
        elif kind == ENTER:
            call = Call(
                consumer,
                eid,
                stream,
                entry_id,
                int(attempt_s),
                t_ns,
                entry_job=entry_job,
                info_job=info_job,
                replayed_from=replayed_from,
            )
            calls.append(call)
            open_calls[(eid, stream, entry_id, int(attempt_s))].append(call)
        elif kind == EXIT:
            waiting = open_calls.get((eid, stream, entry_id, int(attempt_s)))
            if not waiting:
                unmatched += 1
                continue
            call = waiting.pop(0)
            call.exit_ns, call.status = t_ns, status
    calls.sort(key=lambda c: c.enter_ns)
    for call in calls:
        ep = episodes[call.episode]
        ep.calls.append(call)
        if ep.start_ns is None and not ep.job:
            ep.job = call.info_job  # no S record: the job its calls were handed
    return History(calls, episodes, unmatched)


# -- exclusive ownership ----------------------------------------------------------------


@dataclass
class ExclusiveReport:
    """The outcome of the exclusive-ownership rule (see the :mod:`tests.soak` docstring)."""

    stale_calls: list[str] = field(default_factory=list)
    same_episode_overlaps: list[str] = field(default_factory=list)
    unexcused_overlaps: list[str] = field(default_factory=list)
    excused_overlaps: int = 0  # overlapping pairs excused by the rule
    excused_calls: set[tuple[str, str, int]] = field(default_factory=set)  # their first calls
    offenders: set[str] = field(default_factory=set)  # consumers involved in violations

    @property
    def violations(self) -> int:
        return (
            len(self.stale_calls) + len(self.same_episode_overlaps) + len(self.unexcused_overlaps)
        )


def _frozen_in_flight(
    call: Call, episode: Episode, other_begin_ns: int, stops: Sequence[tuple[int, int]]
) -> bool:
    """The SIGSTOP exception: ``call``'s process was stopped when the other episode
    began, and ``call`` is the first call its episode started after the SIGCONT (it
    had passed its lease check before the stop and read its clock only after it)."""
    for stop_ns, cont_ns in stops:
        if stop_ns <= other_begin_ns <= cont_ns and call.enter_ns >= cont_ns:
            first_after = next((c for c in episode.calls if c.enter_ns >= cont_ns), None)
            return first_after is call
    return False


def _in_flight_when_disowned(
    x: Call,
    y: Call,
    episodes: Mapping[str, Episode],
    stops: Mapping[str, Sequence[tuple[int, int]]],
) -> bool:
    """Rule 3: ``x`` is the last call of its episode and was in flight when ``y``'s
    episode began (it entered before, or the SIGSTOP exception applies to it)."""
    ep_x, ep_y = episodes[x.episode], episodes[y.episode]
    if ep_x.calls[-1] is not x:
        return False
    return x.enter_ns < ep_y.begin_ns or _frozen_in_flight(
        x, ep_x, ep_y.begin_ns, stops.get(x.consumer, ())
    )


def check_exclusive(
    history: History, stops: Mapping[str, Sequence[tuple[int, int]]]
) -> ExclusiveReport:
    """Apply the exclusive-ownership rule. ``history.resolve()`` must have run.

    Args:
        stops: consumer -> (SIGSTOP, SIGCONT) times in unix ns, for the exception.
    """
    report = ExclusiveReport()
    episodes = history.episodes
    per_stream_eps: dict[str, list[Episode]] = defaultdict(list)
    for ep in episodes.values():
        per_stream_eps[ep.stream].append(ep)

    # Stale calls: entered after a later episode of the same stream had begun.
    for ep in episodes.values():
        later = [o for o in per_stream_eps[ep.stream] if o is not ep and o.begin_ns > ep.begin_ns]
        if not later:
            continue
        for call in ep.calls:
            for other in later:
                if other.begin_ns < call.enter_ns and not _frozen_in_flight(
                    call, ep, other.begin_ns, stops.get(call.consumer, ())
                ):
                    late_ms = (call.enter_ns - other.begin_ns) / 1e6
                    report.stale_calls.append(
                        f"{call.describe()} entered {late_ms:.1f} ms "
                        f"after episode {other.id} of {other.consumer} began"
                    )
                    report.offenders.update({call.consumer, other.consumer})
                    break

    # Overlapping pairs.
    for calls in history.by_stream().values():
        for i, a in enumerate(calls):
            for b in calls[i + 1 :]:
                if b.enter_ns >= a.end_ns:
                    break
                pair = f"{a.describe()} and {b.describe()} overlap by " + (
                    f"{(min(a.end_ns, b.end_ns) - b.enter_ns) / 1e6:.1f} ms"
                )
                if a.episode == b.episode:
                    report.same_episode_overlaps.append(pair)
                    report.offenders.add(a.consumer)
                    continue
                excused = next(
                    (
                        x
                        for x, y in ((a, b), (b, a))
                        if _in_flight_when_disowned(x, y, episodes, stops)
                    ),
                    None,
                )
                if excused is not None:
                    report.excused_overlaps += 1
                    report.excused_calls.add((excused.episode, excused.entry_id, excused.attempt))
                else:
                    report.unexcused_overlaps.append(
                        f"{pair}: neither is the last call of its episode, in flight when "
                        "the other's episode began"
                    )
                    report.offenders.update({a.consumer, b.consumer})
    return report


# -- finished jobs started again -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Replay:
    """One dead letter a replay put back (the runner logs them)."""

    stream: str
    origin_id: str  # the entry's id when it was first dead-lettered
    new_id: str  # the copy's id in the stream ('' if unknown)
    job: str  # the job of the dead entry (its dead letter's job info)
    reassigned: bool = False  # the replay queued a new assignment for the stream
    start_ns: int = 0  # the replay call that put it back: began ...
    end_ns: int = 0  # ... and returned


def _job_label(stream: str, job: str) -> str:
    return f"{stream} job {job}" if job else stream


def restarted_after_finish(
    history: History, replays: Iterable[Replay] = ()
) -> dict[str, list[str]]:
    """Jobs with an episode that began after an earlier episode had ended the job
    (on_stream_end or on_stream_cancelled): a second run of a finished job, which never
    gets an end marker. Episodes are grouped by stream and job (a later job of a reused
    name is another job). A replay that queued a new assignment for the job's stream
    with the job's info (its dead entries' job) starts such a run on purpose: an
    episode that began after that replay call began is excused if the call returned
    after the episode that ended the job had begun (the end hook's record may come
    late: a worker stopped right after the job completed). So is an episode that handed
    over nothing but replayed copies (a replay's run whose call was not logged as
    having queued it: one that failed midway, or joined a run another call queued).

    Returns:
        "<stream> job <n>" (just the stream for records without jobs) -> descriptions
        of the episode that ended it and those that came after.
    """
    out: dict[str, list[str]] = {}
    groups: dict[tuple[str, str], list[Episode]] = defaultdict(list)
    for ep in history.episodes.values():
        groups[(ep.stream, ep.job)].append(ep)
    restarts: dict[tuple[str, str], list[tuple[int, int]]] = defaultdict(list)
    for r in replays:
        if r.reassigned:
            restarts[(r.stream, r.job)].append((r.start_ns, r.end_ns))
    for (stream, job), eps in groups.items():
        ends = sorted((e.ended_ns, e) for e in eps if e.ended_ns is not None)
        if not ends:
            continue
        windows = restarts.get((stream, job), [])
        found: list[str] = []
        first_end: Episode | None = None
        for ep in sorted(eps, key=lambda e: e.begin_ns):
            before = [(t, e) for t, e in ends if t < ep.begin_ns]
            if not before:
                continue
            end_ns, ender = before[-1]
            if any(r0 <= ep.begin_ns and r1 >= ender.begin_ns for r0, r1 in windows):
                continue  # a replay started the job again
            if ep.calls and all(c.replayed_from for c in ep.calls):
                continue  # a replay's run of it: only replayed copies, none of them new
            if first_end is None:
                first_end = ender
            found.append(
                f"started again by {ep.id} {(ep.begin_ns - end_ns) / 1e9:.1f}s later "
                f"({len(ep.calls)} calls)"
            )
        if found and first_end is not None:
            out[_job_label(stream, job)] = [f"finished by {first_end.id}", *found]
    return out


# -- jobs: foreign entries, what was handled, what is lost --------------------------------


@dataclass(frozen=True, slots=True)
class JobRecord:
    """One job as the producer wrote it."""

    n: int
    stream: str
    entries: tuple[tuple[str, str], ...]  # (entry id, kind), in the order appended
    cancelled: bool = False  # cancel_stream() was called for it
    finish_id: str = ""  # its entry with finish=1 ('' if none)


def rerun_jobs(replays: Iterable[Replay]) -> set[str]:
    """Jobs a replay ran again: it queued a new assignment with their info."""
    return {r.job for r in replays if r.reassigned}


def replay_caused(call: Call, tails: Set[EntryKey], rerun: Set[str]) -> bool:
    """Whether a foreign or past-end call comes from a replay (defects of that kind,
    fixed since, are in tests/soak/README.md; the report names them apart): the call is about
    a replayed copy, or about a tail entry (``tails``) of a job a replay ran again (``rerun``)."""
    return bool(call.replayed_from) or (call.origin in tails and call.entry_job in rerun)


def replay_tainted(
    foreign: Iterable[Call], tails: Set[EntryKey], rerun: Set[str]
) -> dict[str, int]:
    """Per stream, the first job that got a tail entry of a job a replay ran again
    (:func:`replay_caused`, not a copy). When that tail ended in an end marker, the
    receiving job ends at it and leaves its own entries to the next job of the name,
    which ends at its predecessor's end marker, and so on: from that job on, the jobs of
    the name are shifted by one (see :func:`downstream`)."""
    out: dict[str, int] = {}
    for c in foreign:
        if not c.replayed_from and replay_caused(c, tails, rerun) and c.info_job.isdigit():
            out[c.stream] = min(out.get(c.stream, int(c.info_job)), int(c.info_job))
    return out


def downstream(stream: str, job: str, tainted: Mapping[str, int]) -> bool:
    """Whether job ``job`` of ``stream`` comes at or after the first job a replay's
    tail reached there (:func:`replay_tainted`)."""
    return job.isdigit() and stream in tainted and int(job) >= tainted[stream]


def foreign_calls(history: History) -> list[Call]:
    """Calls that handed an entry to a job it does not belong to (the entry's ``job``
    field differs from ``message.info["job"]``)."""
    return [c for c in history.calls if c.foreign]


@dataclass
class Accounting:
    """Where every produced entry ended up (see :func:`account`)."""

    produced: int = 0
    handled: int = 0  # distinct entries handled (a call returned; replays count)
    duplicates: int = 0  # extra returned calls beyond the first, over all entries
    duplicated_entries: int = 0
    dead_lettered: int = 0  # unhandled, excused by their dead letter (handler_failed)
    abandoned: int = 0  # unhandled, excused: recovery dead-lettered their job
    skipped: int = 0  # unhandled, excused: their job was cancelled or finished first
    rejects: int = 0  # reject entries
    rejects_handled: int = 0  # ... handled once replayed
    lost: list[str] = field(default_factory=list)  # "<stream> <id> (job n): why"
    lost_copies: list[str] = field(default_factory=list)
    """Of ``lost``: reject entries that were replayed, whose copy was never handled."""
    lost_at: list[tuple[str, int]] = field(default_factory=list)  # (stream, job) of each
    past_end: list[str] = field(default_factory=list)  # tail entries that were handled
    unknown: list[EntryKey] = field(default_factory=list)  # handled, never produced


def _after(a: str, b: str) -> bool:
    return parse_id(a) > parse_id(b)


def skippable(job: JobRecord, entry_id: str, kind: str, copies: Iterable[str]) -> bool:
    """Whether an unhandled entry of ``job`` may have been skipped with the rest of its
    job: the job was cancelled, or the entry (or, for a ``reject`` entry, a replayed
    copy of it) lies after the job's finish entry."""
    if job.cancelled:
        return True
    if not job.finish_id:
        return False
    if _after(entry_id, job.finish_id):
        return True
    return kind == REJECT and any(_after(c, job.finish_id) for c in copies)


def account(
    jobs: Iterable[JobRecord],
    history: History,
    dead_entries: Mapping[EntryKey, str],
    abandoned_jobs: Iterable[int] = (),
    replays: Iterable[Replay] = (),
) -> Accounting:
    """Attribute every handled call to the produced entry it is about (a replayed copy
    to its original) and decide, entry by entry and job by job, what is lost.

    An entry is accounted for if a call for it returned. Otherwise it is excused if:
    its job was dead-lettered by recovery (``abandoned_jobs``); it is not a ``reject``
    entry and it is in the dead-letter stream (``dead_entries``: (stream, id) ->
    reason); its job was cancelled (the rest of a cancelled job may be skipped); it
    lies after its job's finish entry; or it is a ``reject`` entry of a job finished
    early whose replayed copy went after the finish entry (skipped with the job's rest).
    Any other entry is lost: a ``reject`` entry counts only once a replayed copy of it
    was handled. A ``tail`` entry (appended after its job's end point) is never lost,
    and handling it at all is a violation (``past_end``).
    """
    out = Accounting()
    handled = history.handled_origins()
    abandoned = set(abandoned_jobs)
    copies: dict[EntryKey, list[str]] = defaultdict(list)
    for r in replays:
        copies[(r.stream, r.origin_id)] += [r.new_id] if r.new_id else []
    produced: set[EntryKey] = set()
    for job in jobs:
        for entry_id, kind in job.entries:
            key = (job.stream, entry_id)
            produced.add(key)
            out.produced += 1
            times = handled.get(key, 0)
            if times > 1:
                out.duplicates += times - 1
                out.duplicated_entries += 1
            where = f"{job.stream} {entry_id} (job {job.n}"
            if kind == TAIL:
                if times:
                    out.past_end.append(f"{where}, appended after its end) handled {times}x")
                continue
            if kind == REJECT:
                out.rejects += 1
            if times:
                out.handled += 1
                out.rejects_handled += kind == REJECT
                continue
            if job.n in abandoned:
                out.abandoned += 1
            elif kind != REJECT and key in dead_entries:
                out.dead_lettered += 1
            elif skippable(job, entry_id, kind, copies.get(key, ())):
                out.skipped += 1
            elif kind == REJECT:
                if key in copies:
                    ids = ", ".join(copies[key]) or "id unknown"
                    text = f"{where}, reject): its replayed copy ({ids}) was never handled"
                    out.lost_copies.append(text)
                else:
                    why = dead_entries.get(key, "no dead letter")
                    text = f"{where}, reject): never replayed ({why})"
                out.lost.append(text)
                out.lost_at.append((job.stream, job.n))
            else:
                out.lost.append(f"{where}{', ' + kind if kind else ''}): never handled")
                out.lost_at.append((job.stream, job.n))
    out.unknown = sorted(k for k in handled if k not in produced)
    return out


# -- order within an episode ---------------------------------------------------------------


def check_order(history: History) -> list[str]:
    """Within one episode, calls go in id order: the same id again only after a call
    that did not return (a retry), a higher id after one that returned."""
    problems = []
    for ep in history.episodes.values():
        prev: Call | None = None
        for call in ep.calls:
            if prev is not None:
                before, now = parse_id(prev.entry_id), parse_id(call.entry_id)
                if now < before or (now == before and prev.status == OK):
                    problems.append(f"{prev.describe()} was followed by {call.describe()}")
            prev = call
    return problems
