"""The soak's shared-group checks (tests/soak/groups.py), on hand-made histories."""

from __future__ import annotations

from tests.soak.groups import GroupState, Produced, Windows, check_groups, parse_calls
from tests.soak.worker import group_record

S = "grp:x:0"


def _state(records: list[str], **kwargs: object) -> GroupState:
    fields: dict[str, object] = {
        "dead_letters": [],
        "pending": {S: 0},
        "undelivered": {},
        "live_members": [],
        "restart_counters": [],
        **kwargs,
    }
    return GroupState(calls=parse_calls(records), **fields)


def _call(
    consumer: str, entry_id: str, enter: int, exit_: int | None, status: str = "ok"
) -> list[str]:
    out = [group_record("E", consumer, S, entry_id, "1", enter)]
    if exit_ is not None:
        out.append(group_record("X", consumer, S, entry_id, "1", exit_, status))
    return out


PRODUCED = [Produced(1, S, "1-0", "")]


def test_an_entry_handled_once_passes() -> None:
    report = check_groups(PRODUCED, _state(_call("a", "1-0", 10, 20)), Windows())
    assert report.failed == []


def test_an_entry_never_handled_is_lost() -> None:
    report = check_groups(PRODUCED, _state(_call("a", "1-0", 10, None)), Windows())
    assert report.failed == ["group_lost"]


def test_a_poison_entry_must_be_dead_lettered_once() -> None:
    poison = [Produced(1, S, "1-0", "poison")]
    letter = {"_source_stream": S, "_source_id": "1-0", "_dlq_reason": "handler_failed"}
    calls = _call("a", "1-0", 10, 20, "error")
    assert check_groups(poison, _state(calls, dead_letters=[letter]), Windows()).failed == []
    twice = check_groups(poison, _state(calls, dead_letters=[letter, letter]), Windows())
    assert twice.failed == ["group_dead_letters"]
    plain = check_groups(PRODUCED, _state(calls, dead_letters=[letter]), Windows())
    assert "group_dead_letters" in plain.failed


def test_a_second_consumer_while_a_live_one_works_is_an_overlap() -> None:
    records = _call("a", "1-0", 10, 50) + _call("b", "1-0", 30, 40)
    report = check_groups(PRODUCED, _state(sorted(records, key=_t)), Windows())
    assert report.failed == ["group_overlap"]


def test_an_overlap_is_excused_by_a_stop_an_end_or_a_server_fault() -> None:
    records = sorted(_call("a", "1-0", 10, 50) + _call("b", "1-0", 30, 40), key=_t)
    for windows in (
        Windows(stops={"a": [(15, 25)]}),
        Windows(ends={"a": 20}),
        Windows(server_faults=[(5, 35)]),
    ):
        assert check_groups(PRODUCED, _state(records), windows).failed == []
    # A stop after the second call began excuses nothing.
    assert check_groups(PRODUCED, _state(records), Windows(stops={"a": [(35, 45)]})).failed == [
        "group_overlap"
    ]


def test_anything_left_behind_fails() -> None:
    calls = _call("a", "1-0", 10, 20)
    for extra in (
        {"pending": {S: 1}},
        {"undelivered": {S: "1-0 .. 2-0"}},
        {"live_members": ["a~1 on grp"]},
        {"restart_counters": ["P:starts"]},
    ):
        assert check_groups(PRODUCED, _state(calls, **extra), Windows()).failed == [
            "group_left_behind"
        ]


def _t(record: str) -> int:
    return int(record.split("|")[5])
