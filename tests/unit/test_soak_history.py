"""The soak's history rules (tests/soak/history.py) on hand-made histories: no Redis, no processes.

Times are in milliseconds here and scaled to the nanoseconds the records carry.
"""

from __future__ import annotations

from tests.soak.history import (
    FINISH,
    POISON,
    REJECT,
    TAIL,
    History,
    JobRecord,
    Replay,
    account,
    check_exclusive,
    check_order,
    downstream,
    foreign_calls,
    parse,
    replay_caused,
    replay_tainted,
    rerun_jobs,
    restarted_after_finish,
)
from tests.soak.worker import CANCELLED, END, ENTER, EXIT, LOST, OK, START, record
from tests.soak.worker import REJECT as REJECTED

MS = 1_000_000


class Builder:
    """Records of one stream ``s``; each consumer's episodes are numbered from 1."""

    def __init__(self) -> None:
        self.records: list[str] = []
        self.episodes: dict[str, int] = {}

    def start(self, consumer: str, t: int, job: str = "") -> Builder:
        self.episodes[consumer] = self.episodes.get(consumer, 0) + 1
        self.records.append(
            record(START, consumer, self._ep(consumer), "s", t_ns=t * MS, info_job=job)
        )
        return self

    def call(
        self,
        consumer: str,
        entry: str,
        t0: int,
        t1: int | None,
        status: str = OK,
        attempt: int = 1,
        *,
        job: str = "",  # the entry's job field
        to: str | None = None,  # the job it was handed to (default: its own)
        replayed_from: str = "",
    ) -> Builder:
        ep = self._ep(consumer)
        self.records.append(
            record(
                ENTER,
                consumer,
                ep,
                "s",
                entry,
                attempt,
                t0 * MS,
                entry_job=job,
                info_job=job if to is None else to,
                replayed_from=replayed_from,
            )
        )
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


# -- jobs: foreign entries, reruns, what is lost ------------------------------------------


def test_an_entry_handed_to_another_job_is_foreign() -> None:
    b = Builder().start("A", 0, job="1").call("A", "1-0", 1, 2, job="1")
    b.call("A", "2-0", 3, 4, job="1", to="1", replayed_from="1-0")  # its own job: fine
    assert foreign_calls(b.history()) == []
    # A later job of the same name reads an entry the earlier job left behind.
    b.start("B", 10, job="2").call("B", "3-0", 11, 12, job="1", to="2")
    found = foreign_calls(b.history())
    assert [(c.entry_id, c.entry_job, c.info_job) for c in found] == [("3-0", "1", "2")]


def test_a_replayed_copy_handed_to_a_later_job_of_the_name_is_foreign() -> None:
    b = (
        Builder()
        .start("B", 10, job="2")
        .call("B", "9-0", 11, 12, job="1", to="2", replayed_from="1-0")
    )
    found = foreign_calls(b.history())
    assert len(found) == 1
    assert found[0].origin == ("s", "1-0")


def _job(
    n: int, *entries: tuple[str, str], cancelled: bool = False, finish_id: str = ""
) -> JobRecord:
    return JobRecord(n, "s", tuple(entries), cancelled=cancelled, finish_id=finish_id)


def test_unhandled_entries_of_a_cancelled_job_are_skipped_not_lost() -> None:
    h = Builder().start("A", 0, job="1").call("A", "1-0", 1, 2, job="1").history()
    entries = (("1-0", ""), ("2-0", ""), ("3-0", REJECT))
    acc = account([_job(1, *entries, cancelled=True)], h, {})
    assert acc.lost == []
    assert (acc.handled, acc.skipped) == (1, 2)
    # The same job not cancelled: both are lost.
    acc = account([_job(1, *entries)], h, {})
    assert len(acc.lost) == 2
    assert acc.skipped == 0


def test_entries_after_the_finish_entry_are_skipped_those_before_are_not() -> None:
    h = Builder().start("A", 0, job="1").call("A", "2-0", 1, 2, job="1").history()
    job = _job(1, ("1-0", ""), ("2-0", FINISH), ("3-0", ""), finish_id="2-0")
    acc = account([job], h, {})
    assert acc.skipped == 1  # 3-0
    assert [t.split()[1] for t in acc.lost] == ["1-0"]


def test_a_tail_entry_is_never_lost_and_must_never_be_handled() -> None:
    job = _job(1, ("1-0", FINISH), ("2-0", TAIL), finish_id="1-0")
    b = Builder().start("A", 0, job="1").call("A", "1-0", 1, 2, job="1")
    acc = account([job], b.history(), {})
    assert (acc.lost, acc.past_end) == ([], [])
    b.start("B", 10, job="2").call("B", "2-0", 11, 12, job="1", to="2")
    acc = account([job], b.history(), {})
    assert len(acc.past_end) == 1
    assert acc.lost == []


def test_a_reject_entry_counts_only_once_a_replayed_copy_was_handled() -> None:
    job = _job(1, ("1-0", REJECT))
    b = Builder().start("A", 0, job="1").call("A", "1-0", 1, 2, status=REJECTED, job="1")
    # Never replayed, its dead letter still there: lost (a dead letter excuses a
    # poison entry, never a reject).
    acc = account([job], b.history(), {("s", "1-0"): "rejected"})
    assert len(acc.lost) == 1
    assert "never replayed (rejected)" in acc.lost[0]
    assert acc.lost_copies == []
    # Replayed, the copy never handled: lost.
    replay = Replay("s", "1-0", "5-0", "1")
    acc = account([job], b.history(), {}, replays=[replay])
    assert "its replayed copy (5-0) was never handled" in acc.lost[0]
    assert acc.lost_copies == acc.lost
    # The copy handled: accounted for, as the original.
    b.call("A", "5-0", 6, 7, job="1", replayed_from="1-0")
    acc = account([job], b.history(), {}, replays=[replay])
    assert acc.lost == []
    assert (acc.handled, acc.rejects, acc.rejects_handled) == (1, 1, 1)


def test_a_reject_copy_placed_after_the_finish_entry_may_be_skipped() -> None:
    job = _job(1, ("1-0", REJECT), ("2-0", FINISH), finish_id="2-0")
    h = Builder().start("A", 0, job="1").call("A", "2-0", 3, 4, job="1").history()
    acc = account([job], h, {}, replays=[Replay("s", "1-0", "3-0", "1")])
    assert acc.lost == []
    assert acc.skipped == 1
    # A copy before the finish entry was reached: it had to be handled.
    acc = account([job], h, {}, replays=[Replay("s", "1-0", "1-5", "1")])
    assert len(acc.lost) == 1


def test_dead_letters_and_abandoned_jobs_excuse_unhandled_entries() -> None:
    h = Builder().history()
    job = _job(1, ("1-0", POISON), ("2-0", ""))
    acc = account([job], h, {("s", "1-0"): "handler_failed"})
    assert acc.dead_lettered == 1
    assert [t.split()[1] for t in acc.lost] == ["2-0"]
    acc = account([job], h, {}, abandoned_jobs=[1])
    assert (acc.abandoned, acc.lost) == (2, [])


def test_duplicates_and_unknown_entries_are_counted_per_original_entry() -> None:
    b = Builder().start("A", 0, job="1").call("A", "1-0", 1, 2, job="1")
    b.call("A", "7-0", 3, 4, job="1", replayed_from="1-0")  # a second handling, as a copy
    b.call("A", "8-0", 5, 6, job="1")  # never produced
    acc = account([_job(1, ("1-0", ""))], b.history(), {})
    assert (acc.duplicates, acc.duplicated_entries) == (1, 1)
    assert acc.unknown == [("s", "8-0")]


def test_a_later_job_of_a_reused_name_is_not_a_rerun() -> None:
    b = Builder().start("A", 0, job="1").call("A", "1-0", 1, 2, job="1").hook(END, "A", 3)
    b.start("B", 10, job="2").call("B", "2-0", 11, 12, job="2")
    assert restarted_after_finish(b.history()) == {}
    b.start("C", 20, job="1")  # job 1 again, after it ended
    found = restarted_after_finish(b.history())
    assert list(found) == ["s job 1"]
    assert found["s job 1"][0] == "finished by A#1"


def test_a_cancelled_job_started_again_is_a_rerun_unless_a_replay_queued_it() -> None:
    b = Builder().start("A", 5, job="1").hook(CANCELLED, "A", 8).start("B", 20, job="1")
    history = b.history()
    assert history.episodes["A#1"].cancelled
    assert list(restarted_after_finish(history)) == ["s job 1"]
    # A replay of a dead entry of job 1 queued a new run of it between the two.
    replay = Replay("s", "1-0", "9-0", "1", reassigned=True, start_ns=2 * MS, end_ns=15 * MS)
    assert restarted_after_finish(history, [replay]) == {}
    # Not one of another job, nor one that only appended to a running job.
    other = Replay("s", "1-0", "9-0", "2", reassigned=True, start_ns=2 * MS, end_ns=15 * MS)
    placed = Replay("s", "1-0", "9-0", "1", start_ns=2 * MS, end_ns=15 * MS)
    # Nor one that was over before the run that ended began (it started that run).
    before = Replay("s", "1-0", "9-0", "1", reassigned=True, start_ns=0, end_ns=1 * MS)
    # Nor one called only after the episode had begun.
    late = Replay("s", "1-0", "9-0", "1", reassigned=True, start_ns=25 * MS, end_ns=30 * MS)
    assert list(restarted_after_finish(history, [other, placed, before, late])) == ["s job 1"]


def test_failures_a_replay_causes_are_told_apart() -> None:
    b = Builder().start("B", 10, job="2")
    b.call("B", "9-0", 11, 12, job="1", to="2", replayed_from="1-0")  # a copy
    b.call("B", "3-0", 13, 14, job="1", to="2")  # job 1's tail entry
    b.call("B", "4-0", 15, 16, job="1", to="2")  # job 1's entry, not a tail
    copy, tail, other = foreign_calls(b.history())
    tails = {("s", "3-0")}
    rerun = rerun_jobs(
        [Replay("s", "1-0", "2-0", "1", reassigned=True), Replay("s", "5-0", "6-0", "3")]
    )
    assert rerun == {"1"}
    assert replay_caused(copy, tails, set())
    assert replay_caused(tail, tails, rerun)
    assert not replay_caused(tail, tails, set())  # no replay ran job 1 again
    assert not replay_caused(other, tails, rerun)


def test_after_a_replay_rerun_the_later_jobs_of_the_name_are_tainted() -> None:
    # Job 1 ended early; a replay ran it again; its tail entry 3-0 went to job 5, whose
    # own entry 6-0 then went to job 7.
    b = Builder().start("B", 10, job="5").call("B", "3-0", 11, 12, job="1", to="5")
    b.start("C", 20, job="7").call("C", "6-0", 21, 22, job="5", to="7")
    b.call("C", "9-0", 23, 24, job="1", to="7", replayed_from="2-0")  # a copy: no taint
    foreign = foreign_calls(b.history())
    tails = {("s", "3-0"), ("s", "3-1")}
    assert replay_tainted(foreign, tails, {"1"}) == {"s": 5}
    # The first job of the name a tail reached counts, whatever the order of the calls.
    b.start("D", 1, job="4").call("D", "3-1", 2, 3, job="1", to="4")
    assert replay_tainted(foreign_calls(b.history()), tails, {"1"}) == {"s": 4}
    assert replay_tainted(foreign, tails, set()) == {}  # no rerun: not a replay's doing
    tainted = {"s": 5}
    assert downstream("s", "5", tainted)
    assert downstream("s", "7", tainted)
    assert not downstream("s", "4", tainted)
    assert not downstream("t", "7", tainted)


def test_a_run_that_handed_over_only_replayed_copies_is_not_a_rerun() -> None:
    b = Builder().start("A", 0, job="1").call("A", "1-0", 1, 2, job="1").hook(END, "A", 3)
    b.start("B", 20, job="1").call("B", "9-0", 21, 22, job="1", replayed_from="1-0")
    assert restarted_after_finish(b.history()) == {}, "a replay's run, no replay logged"
    b.call("B", "2-0", 23, 24, job="1")  # an entry of its own: a rerun after all
    assert list(restarted_after_finish(b.history())) == ["s job 1"]
