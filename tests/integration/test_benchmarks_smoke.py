"""Smoke test of ``benchmarks/hot_stream.py``: it runs end to end against the test Redis,
both contenders handle exactly N entries, and it prints a ratio. No timing assertions."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis as AsyncRedis

from benchmarks import hot_stream
from benchmarks.hot_stream import BenchmarkError, Target, main

N = 2000
ROOT = Path(__file__).resolve().parents[2]


def test_hot_stream_runs_and_verifies_counts(
    redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--redis-url", redis_url, "--use-url", "--entries", str(N), "--rounds", "1"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert re.search(r"^round 1/1 .* ratio streamjobs/bare \d+\.\d+$", out, re.MULTILINE), out
    assert re.search(r"^median ratio streamjobs/bare: \d+\.\d+", out, re.MULTILINE), out
    assert f"verified: bare handled {N}/{N}, streamjobs handled {N}/{N}" in out, out
    assert re.search(r"^Redis commands/entry, streamjobs: \d+\.\d+", out, re.MULTILINE), out


@pytest.mark.anyio
@pytest.mark.parametrize("contender", ["bare", "streamjobs"])
async def test_a_short_count_raises(
    redis_url: str, uid: str, contender: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The benchmark checks its own counts: one entry short is an error, not a result."""
    real_produce = hot_stream.produce

    async def produce_one_short(client: Any, stream: str, n: int) -> None:
        await real_produce(client, stream, n - 1)

    monkeypatch.setattr(hot_stream, "produce", produce_one_short)
    target = Target(redis_url, private=False)
    client = AsyncRedis.from_url(redis_url, decode_responses=False)
    admin = AsyncRedis.from_url(redis_url, decode_responses=True)
    stream = f"bench:{uid}:{contender}"
    try:
        run = (
            hot_stream.run_bare(client, admin, target, stream, 50, 10)
            if contender == "bare"
            else hot_stream.run_streamjobs(client, admin, target, stream, f"bench-{uid}", 50, 10)
        )
        with pytest.raises(BenchmarkError, match="handled 49/50"):
            await run
    finally:
        await hot_stream.delete_keys_containing(admin, uid)
        await client.aclose()
        await admin.aclose()


def test_big_entries_runs_and_reports_the_worst_command(
    require_redis_server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from benchmarks import big_entries

    assert big_entries.main(["--entries", "3", "--mb", "1"]) == 0
    out = capsys.readouterr().out
    assert "drained 3 entries of 1 MB" in out, out
    assert re.search(r"^XREADGROUP +calls +\d+ +slowest +\d+\.\d ms$", out, re.MULTILINE), out
    assert re.search(r"^worst single command: [A-Z]+ \d+\.\d ms$", out, re.MULTILINE), out


def test_scan_cost_runs_and_reports_paced_passes(
    require_redis_server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from benchmarks import scan_cost

    assert scan_cost.main(["--assignments", "300", "--passes", "2"]) == 0
    out = capsys.readouterr().out
    assert "300 pending assignments, every owner alive" in out, out
    assert re.search(r"^\| paced 2 \| \d+ \| [\d,]+ \| \d+\.\d \| \d+ \|$", out, re.MULTILINE), out
    assert re.search(r"^\| unpaced, whole list \| 4 \| 300 \|", out, re.MULTILINE), out


def test_many_streams_runs_both_contenders_and_checks_their_counts(
    require_redis_server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from benchmarks import many_streams

    assert many_streams.main(["--streams", "20", "--entries", "3", "--rounds", "2"]) == 0
    out = capsys.readouterr().out
    assert "20 streams x 3 entries, 2 processes each side" in out, out
    assert re.search(r"^\| 2 \| [\d,]+ \| [\d,]+ \| \d+\.\d{3} \|$", out, re.MULTILINE), out
    assert re.search(r"^median ratio streamjobs/bare: \d+\.\d{3}$", out, re.MULTILINE), out


def test_shared_group_runs_both_parts_and_checks_their_counts(
    require_redis_server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from benchmarks import shared_group

    argv = ["--entries", "2000", "--rounds", "2", "--processes", "1,2", "--process-entries", "500"]
    assert shared_group.main(argv) == 0
    out = capsys.readouterr().out
    assert re.search(r"^\| 2 \| [\d,]+ \| [\d,]+ \| \d+\.\d{3} \| \d+\.\d{4} \|$", out, re.M), out
    assert re.search(r"^\| median \| [\d,]+ \| [\d,]+ \| \d+\.\d{3} \(goal", out, re.M), out
    for processes in (1, 2):
        assert re.search(rf"^\| {processes} \| [\d,]+ \| \d+\.\d\d \|$", out, re.M), out


def test_idle_cost_runs_and_reports_its_table(
    require_redis_server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from benchmarks import idle_cost

    assert idle_cost.main(["--streams", "30", "--wakeups", "5", "--window-s", "0.5"]) == 0
    out = capsys.readouterr().out
    assert "30 idle streams owned by one consumer" in out, out
    for mode in ("lock", "session"):
        row = (
            rf"^\| {mode} \| \d+ \| [\d,]+ \| [\d,]+ \| [\d,]+ \| -?\d+\.\d KiB \| "
            r"\d+\.\d ms \| \d+\.\d ms \|$"
        )
        assert re.search(row, out, re.MULTILINE), out


def test_status_cost_reads_every_owned_stream(
    require_redis_server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from benchmarks import status_cost

    assert status_cost.main(["--streams", "30", "--dead", "5", "--rounds", "2"]) == 0
    out = capsys.readouterr().out
    assert "30 owned streams over 4 consumers, 5 dead letters" in out, out
    assert re.search(r"^\| 2 \| \d+ \| \d+\.\d \| [\d,]+ \|$", out, re.MULTILINE), out


def test_recovery_latency_measures_every_stream_of_the_victim(
    require_redis_server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from benchmarks import recovery_latency

    args = ["--streams", "3", "--ttl", "1", "--unrelated", "0", "--scenarios", "kill,stop"]
    assert recovery_latency.main(args) == 0
    out = capsys.readouterr().out
    for scenario in ("kill", "stop"):
        row = rf"^\| {scenario} \| 0 \| 3 \| [\d.]+ \| [\d.]+ \| [\d.]+ \| 2\.0 \| (yes|no) \|$"
        assert re.search(row, out, re.MULTILINE), out


def test_the_runner_writes_json_and_markdown(require_redis_server: str, tmp_path: Path) -> None:
    from benchmarks import __main__ as runner

    assert runner.main(["--quick", "--only", "scan_cost,status_cost", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert [r["scenario"] for r in results["runs"]] == ["scan_cost", "status_cost"]
    assert all(r["exit_code"] == 0 for r in results["runs"])
    status_rows = results["runs"][1]["tables"][0]
    assert [row["round"] for row in status_rows] == ["1", "2"]
    assert results["machine"]["sizes"] == "quick"
    markdown = (tmp_path / "results.md").read_text()
    assert "## status_cost (ok," in markdown
    assert "| round | wall ms | Redis CPU ms | commands |" in markdown


def test_the_runner_runs_the_cluster_scenarios_with_cluster() -> None:
    """``hot_stream_cluster``, ``many_streams_cluster`` and ``idle_cost_cluster`` are
    their modules with
    ``--cluster``, at both sizes (no server needed: nothing is run)."""
    from benchmarks import __main__ as runner

    for scenario, module in (
        ("hot_stream_cluster", "hot_stream"),
        ("many_streams_cluster", "many_streams"),
        ("idle_cost_cluster", "idle_cost"),
    ):
        assert runner.MODULES[scenario] == module
        assert (ROOT / "benchmarks" / f"{module}.py").is_file()
        full, quick = runner.SCENARIOS[scenario]
        assert "--cluster" in full, full
        assert "--cluster" in quick, quick
