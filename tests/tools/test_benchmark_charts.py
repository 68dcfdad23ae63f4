"""``python -m benchmarks --plot`` (benchmarks/plot.py): what it reads from a run's
tables, and that it draws a chart per scenario group, skipping what the run lacks.

The tables are text in the scenarios' own output format, parsed by the runner as a run
would be; the smoke tests (tests/integration/test_benchmarks_smoke.py) feed the real
output of short runs through the same readers."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pytest

from benchmarks import __main__ as runner
from benchmarks import plot

HOT = """\
| round | bare entries/s | streamjobs entries/s | ratio streamjobs/bare | streamjobs cmds/entry |
|---|---|---|---|---|
| 1 | 56,326 | 33,664 | 0.598 | 0.0912 |
| 2 | 58,277 | 40,224 | 0.690 | 0.0911 |
| 3 | 62,217 | 36,585 | 0.588 | 0.0911 |
| median | 58,277 | 36,585 | 0.598 | 0.0911 (all rounds) |
"""
MANY = """\
2,000 streams x 10 entries, 2 processes each side
| round | bare entries/s | streamjobs entries/s | ratio streamjobs/bare |
|---|---|---|---|
| 1 | 33,708 | 4,846 | 0.144 |
| 2 | 20,835 | 3,355 | 0.161 |
median ratio streamjobs/bare: 0.152
"""
PEERS = """\
| contender | median entries/s | streamjobs/contender | contender/bare |
|---|---|---|---|
| bare | 61,219 | 0.570 | 1.000 |
| streamjobs | 36,005 | 1.000 | 0.570 |
| taskiq | 895 | 38.848 | 0.015 |
"""


def idle(streams: int, rss: str) -> str:
    return f"""\
{streams:,} idle streams owned by one consumer (lock TTL 10 s)
| liveness | connections | Redis commands/s in the window | with idle re-reads | RSS per stream |
|---|---|---|---|---|
| session | 25 | 19 | 374 | {rss} KiB |
"""


RECOVERY = """\
| scenario | unrelated TTL keys | streams | p50 s | p99 s | max s | target s | met |
|---|---|---|---|---|---|---|---|
| kill | 0 | 100 | 3.58 | 3.97 | 3.97 | 4.0 | yes |

| scenario | unrelated TTL keys | p0 s | p10 s | p20 s | p30 s | p40 s | p50 s | p60 s | p70 s \
| p80 s | p90 s | p100 s |
|---|---|---|---|---|---|---|---|---|---|---|---|---|
| kill | 0 | 3.01 | 3.10 | 3.20 | 3.30 | 3.40 | 3.58 | 3.60 | 3.70 | 3.80 | 3.90 | 3.97 |
""".replace(" \\\n", " ")


def a_run(scenario: str, text: str, command: list[str] | None = None) -> dict[str, Any]:
    tables, notes = runner.parse_tables(text)
    return {
        "scenario": scenario,
        "command": command or ["-m", f"benchmarks.{scenario}"],
        "exit_code": 0,
        "seconds": 1.0,
        "tables": tables,
        "notes": notes,
    }


def results(*runs: dict[str, Any]) -> dict[str, Any]:
    return {"machine": {"date": "today", "cpus": 2, "server": "redis"}, "runs": list(runs)}


def test_ratios_are_the_median_of_the_rounds_and_the_peers_ratio_to_bare() -> None:
    ours, peers = plot.ratios(results(a_run("hot_stream", HOT), a_run("many_streams", MANY)))
    assert ours == {
        "hot stream": statistics.median([0.598, 0.690, 0.588]),
        "many streams": statistics.median([0.144, 0.161]),
    }
    assert peers == {}
    _, peers = plot.ratios(results(a_run("peers", PEERS)))
    assert peers == {"streamjobs": 0.570, "taskiq": 0.015}


def test_a_failed_scenario_is_not_read() -> None:
    failed = a_run("hot_stream", HOT) | {"exit_code": 1}
    assert plot.ratios(results(failed)) == ({}, {})


def idle_run(scenario: str, streams: int, rss: str) -> dict[str, Any]:
    command = ["-m", "benchmarks.idle_cost", "--streams", str(streams)]
    return a_run(scenario, idle(streams, rss), command)


def test_idle_points_are_ordered_by_the_streams_of_each_run() -> None:
    runs = [
        idle_run("idle_cost", 10000, "10.9"),
        idle_run("idle_cost_500", 500, "12.5"),
    ]
    points = plot.idle_points(results(*runs))
    assert [(n, v["RSS per stream"]) for n, v in points] == [(500, 12.5), (10000, 10.9)]
    assert points[0][1]["Redis commands/s in the window"] == 19


def test_recovery_deciles_carry_their_target() -> None:
    series = plot.recovery_deciles(results(a_run("recovery_latency", RECOVERY)))
    deciles, target = series["kill, 0 unrelated keys, 100 streams"]
    assert deciles == [3.01, 3.10, 3.20, 3.30, 3.40, 3.58, 3.60, 3.70, 3.80, 3.90, 3.97]
    assert target == 4.0


def test_every_chart_is_drawn_and_a_missing_one_is_named(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    path = tmp_path / "results.json"
    full = results(
        a_run("hot_stream", HOT),
        a_run("peers", PEERS),
        idle_run("idle_cost", 2000, "10.2"),
        a_run("recovery_latency", RECOVERY),
    )
    path.write_text(json.dumps(full))
    charts = plot.draw(path, tmp_path / "charts")
    assert {c.name for c in charts if c.path} == {"ratios", "idle_cost", "recovery"}
    for chart in charts:
        assert chart.path is not None
        assert chart.path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert chart.path.stat().st_size > 10_000  # axes, bars and labels, not an empty canvas

    path.write_text(json.dumps(results(a_run("hot_stream", HOT))))
    charts = plot.draw(path, tmp_path / "some")
    skipped = {c.name: c.note for c in charts if c.path is None}
    assert skipped == {
        "idle_cost": "skipped: no idle_cost run",
        "recovery": "skipped: no recovery_latency run with its deciles table",
    }


def test_plot_without_a_run_says_what_to_run(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="run 'python -m benchmarks' first"):
        runner.main(["--plot", "--out", str(tmp_path), "--charts", str(tmp_path / "c")])
