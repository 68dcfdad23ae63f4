"""The soak's history rules (soak/history.py) on hand-made histories: no Redis, no processes.

Times are in milliseconds here and scaled to the nanoseconds the records carry.
"""

from __future__ import annotations

from soak.history import History, check_exclusive, check_order, parse, restarted_after_finish
from soak.worker import END, ENTER, EXIT, LOST, OK, START, record

MS = 1_000_000


class Builder:
    """Records of one stream ``s``; each consumer's episodes are numbered from 1."""

    def __init__(self) -> None:
        self.records: list[str] = []
        self.episodes: dict[str, int] = {}

    def start(self, consumer: str, t: int) -> Builder:
        self.episodes[consumer] = self.episodes.get(consumer, 0) + 1
        self.records.append(record(START, consumer, self._ep(consumer), "s", t_ns=t * MS))
        return self

    def call(
        self, consumer: str, entry: str, t0: int, t1: int | None, status: str = OK, attempt: int = 1
    ) -> Builder:
        ep = self._ep(consumer)
        self.records.append(record(ENTER, consumer, ep, "s", entry, attempt, t0 * MS))
        if t1 is not None:
            self.records.append(record(EXIT, consumer, ep, "s", entry, attempt, t1 * MS, status))
        return self

    def hook(self, kind: str, consumer: str, t: int) -> Builder:
        self.records.append(record(kind, consumer, self._ep(consumer), "s", t_ns=t * MS))
        return self

    def _ep(self, consumer: str) -> str:
        return f"{consumer}#{self.episodes.get(consumer, 0)}"

    def history(self, ends: dict[str, int] | None = None) -> History:
        h = parse(sorted(self.records, key=lambda r: int(r.split("|")[6])))
        h.resolve({c: t * MS for c, t in (ends or {}).items()}, fallback_end_ns=10**6 * MS)
        return h


def stops(*intervals: tuple[int, int]) -> list[tuple[int, int]]:
    return [(a * MS, b * MS) for a, b in intervals]


def test_a_clean_handover_has_no_overlap() -> None:
    b = Builder().start("A", 0).call("A", "1-0", 1, 2).call("A", "2-0", 3, 4).hook(END, "A", 5)
    b.start("B", 10).call("B", "3-0", 11, 12)
    report = check_exclusive(b.history(), {})
    assert report.violations == 0
    assert report.excused_overlaps == 0


def test_the_in_flight_call_of_a_disowned_consumer_is_excused() -> None:
    # A's call on 2-0 runs long; B takes over and handles 2-0 and 3-0 meanwhile.
    b = Builder().start("A", 0).call("A", "1-0", 1, 2).call("A", "2-0", 3, 50)
    b.start("B", 20).call("B", "2-0", 21, 22).call("B", "3-0", 23, 24)
    b.hook(LOST, "A", 51)
    report = check_exclusive(b.history(), {})
    assert report.violations == 0, report
    assert report.excused_overlaps == 2
    assert report.excused_calls == {("A#1", "2-0", 1)}


def test_a_call_without_exit_lasts_until_its_process_ended() -> None:
    b = Builder().start("A", 0).call("A", "1-0", 1, None)  # killed mid-call at t=30
    b.start("B", 20).call("B", "1-0", 21, 22)
    report = check_exclusive(b.history({"A": 30}), {})
    assert report.violations == 0
    assert report.excused_overlaps == 1
    report = check_exclusive(b.history({"A": 15}), {})
    assert report.excused_overlaps == 0


def test_two_owners_interleaving_is_a_violation() -> None:
    b = Builder().start("A", 0).call("A", "1-0", 1, 30)
    b.start("B", 20).call("B", "1-0", 21, 40)
    b.call("A", "2-0", 31, 45)  # A goes on after B began: stale, and overlaps B's call
    report = check_exclusive(b.history(), {})
    assert len(report.stale_calls) == 1
    assert "A [A#1] s 2-0" in report.stale_calls[0]
    # (A 1-0, B 1-0): A's call is not the last of its episode.
    # (B 1-0, A 2-0): A's call entered after B's episode began... as the second entrant.
    assert len(report.unexcused_overlaps) == 2
    assert report.offenders == {"A", "B"}


def test_a_stale_call_is_a_violation_even_without_overlap() -> None:
    b = Builder().start("A", 0).call("A", "1-0", 1, 2)
    b.start("B", 10).call("B", "2-0", 11, 12)
    b.call("A", "3-0", 13, 14)  # A hands an entry after B acquired the stream
    report = check_exclusive(b.history(), {})
    assert len(report.stale_calls) == 1
    assert not report.unexcused_overlaps


def test_a_call_that_entered_after_the_new_episode_began_is_not_excused() -> None:
    b = Builder().start("A", 0).start("B", 10).call("B", "1-0", 11, 30)
    # A's only call enters after B's episode began (A had no lock any more).
    b.call("A", "1-0", 12, 20)
    report = check_exclusive(b.history(), {})
    assert report.violations >= 1
    assert report.stale_calls


def test_reacquisition_by_the_same_consumer_is_a_new_episode() -> None:
    b = Builder().start("A", 0).call("A", "1-0", 1, 30)  # frozen, lost
    b.start("A", 20).call("A", "1-0", 21, 22).call("A", "2-0", 23, 24)
    report = check_exclusive(b.history(), {})
    assert report.violations == 0
    assert report.excused_overlaps == 2


def test_overlap_within_one_episode_is_a_violation() -> None:
    b = Builder().start("A", 0).call("A", "1-0", 1, 10).call("A", "2-0", 5, 12)
    report = check_exclusive(b.history(), {})
    assert len(report.same_episode_overlaps) == 1


def test_sigstop_between_lease_check_and_clock_read_is_excused_once() -> None:
    # A was stopped at 5..40; B began at 20. A's first call after the SIGCONT is the
    # one that had passed its lease check before the stop.
    b = Builder().start("A", 0).call("A", "1-0", 1, 2)
    b.start("B", 20).call("B", "2-0", 21, 60)
    b.call("A", "2-0", 40, 45)
    history = b.history()
    report = check_exclusive(history, {"A": stops((5, 40))})
    assert report.violations == 0, report
    assert report.excused_overlaps == 1
    # Without the stop it is a stale call.
    assert check_exclusive(history, {}).stale_calls
    # A second call after the SIGCONT is never excused.
    b.call("A", "3-0", 46, 47)
    report = check_exclusive(b.history(), {"A": stops((5, 40))})
    assert len(report.stale_calls) == 1
    assert "3-0" in report.stale_calls[0]


def test_order_within_an_episode() -> None:
    b = Builder().start("A", 0).call("A", "1-0", 1, 2, status="error")
    b.call("A", "1-0", 3, 4, attempt=2).call("A", "2-0", 5, 6).call("A", "10-0", 7, 8)
    assert check_order(b.history()) == []
    b.call("A", "10-0", 9, 10)  # the same id again after it returned
    b.call("A", "3-0", 11, 12)  # going backwards
    assert len(check_order(b.history())) == 2
    # A new episode may start lower (redelivery after a crash).
    b.start("A", 20).call("A", "2-0", 21, 22)
    assert len(check_order(b.history())) == 2


def test_parse_pairs_exits_and_counts_handled() -> None:
    b = Builder().start("A", 0).call("A", "1-0", 1, 2, status="error")
    b.call("A", "1-0", 3, 4, attempt=2).call("A", "2-0", 5, None)
    b.records.append(record(EXIT, "A", "A#1", "s", "9-0", 1, 7 * MS, OK))
    h = b.history({"A": 8})
    assert h.unmatched_exits == 1
    assert [c.status for c in h.calls] == ["error", OK, None]
    assert h.calls[-1].end_ns == 8 * MS
    assert h.handled() == {("s", "1-0"): 1}


def test_a_stream_started_again_after_it_finished_is_found() -> None:
    b = Builder().start("A", 0).call("A", "1-0", 1, 2).hook(END, "A", 3)
    assert restarted_after_finish(b.history()) == {}
    b.start("B", 2003)  # a second job for the finished stream
    found = restarted_after_finish(b.history())
    assert list(found) == ["s"]
    assert found["s"][0] == "finished by A#1"
    assert "started again by B#1 2.0s later (0 calls)" in found["s"][1]
