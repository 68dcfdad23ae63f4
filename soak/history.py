"""The soak's history checks: pure functions over the records the workers pushed.

The records are described in :mod:`soak.worker`; the rules checked here (exclusive
ownership with the one allowed exception, order within an episode) are stated in the
package docstring (:mod:`soak`). Nothing here does I/O, so the rules are unit-tested
on hand-made histories (``tests/unit/test_soak_history.py``).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from .worker import END, ENTER, EXIT, LOST, OK, START

StreamId = tuple[int, int]


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
    ended_ns: int | None = None  # the F record (on_stream_end)

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

    def by_stream(self) -> dict[str, list[Call]]:
        out: dict[str, list[Call]] = defaultdict(list)
        for call in self.calls:
            out[call.stream].append(call)
        for calls in out.values():
            calls.sort(key=lambda c: c.enter_ns)
        return out


def parse(records: Iterable[str]) -> History:
    """Build the history from raw records (see :mod:`soak.worker` for the format)."""
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
        kind, consumer, eid, stream, entry_id, attempt_s, t_s, status = raw.split("|")
        t_ns = int(t_s)
        ep = episode_of(eid, consumer, stream)
        if kind == START:
            ep.start_ns = t_ns
        elif kind == LOST:
            ep.lost = True
        elif kind == END:
            ep.ended = True
            ep.ended_ns = t_ns
        elif kind == ENTER:
            call = Call(consumer, eid, stream, entry_id, int(attempt_s), t_ns)
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
        episodes[call.episode].calls.append(call)
    return History(calls, episodes, unmatched)


# -- exclusive ownership ----------------------------------------------------------------


@dataclass
class ExclusiveReport:
    """The outcome of the exclusive-ownership rule (see the :mod:`soak` docstring)."""

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


# -- finished streams started again ----------------------------------------------------


def restarted_after_finish(history: History) -> dict[str, list[str]]:
    """Streams with an episode that began after an earlier episode had finished them
    (on_stream_end): a second job for a finished stream, which never gets an end marker.

    Returns:
        stream -> descriptions of the episode that finished it and those that came after.
    """
    out: dict[str, list[str]] = {}
    by_stream: dict[str, list[Episode]] = defaultdict(list)
    for ep in history.episodes.values():
        by_stream[ep.stream].append(ep)
    for stream, eps in by_stream.items():
        finished = [e for e in eps if e.ended_ns is not None]
        if not finished:
            continue
        first_end = min(finished, key=lambda e: e.ended_ns or 0)
        end_ns = first_end.ended_ns or 0
        later = sorted((e for e in eps if e.begin_ns > end_ns), key=lambda e: e.begin_ns)
        if later:
            out[stream] = [f"finished by {first_end.id}"] + [
                f"started again by {e.id} {(e.begin_ns - end_ns) / 1e9:.1f}s later "
                f"({len(e.calls)} calls)"
                for e in later
            ]
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
