"""Smoke test of ``--cluster`` in ``benchmarks/hot_stream.py`` and
``benchmarks/many_streams.py``: run as a user would (a subprocess from the repository
root), each starts its own 3-primary + 3-replica cluster, both contenders handle every
entry, the table is printed and the run exits 0. No timing assertions."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

TIMEOUT_S = 100.0  # under the suite's 120 s per test
ROW = r"[\d,]+ \| [\d,]+ \| \d+\.\d{3} \|"


def run_benchmark(module: str, *args: str) -> str:
    """``python -m benchmarks.<module> *args``; its output, after checking it exited 0."""
    done = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{module}", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    return out


@pytest.mark.usefixtures("require_cluster_binaries")
def test_hot_stream_on_the_cluster() -> None:
    n = 2000
    out = run_benchmark("hot_stream", "--entries", str(n), "--rounds", "1", "--cluster")
    assert "at a private OSS Redis Cluster, 3 primaries + 3 replicas" in out, out
    assert f"verified: bare handled {n}/{n}, streamjobs handled {n}/{n}" in out, out
    assert re.search(r"^## hot stream on the cluster \(3 primaries\)$", out, re.MULTILINE), out
    assert "| round | bare entries/s | streamjobs entries/s | ratio streamjobs/bare |" in out
    assert re.search(rf"^\| 1 \| {ROW}", out, re.MULTILINE), out
    assert re.search(rf"^\| median \| {ROW}", out, re.MULTILINE), out


@pytest.mark.usefixtures("require_cluster_binaries")
def test_many_streams_on_the_cluster() -> None:
    args = ["--streams", "50", "--entries", "5", "--rounds", "1", "--cluster"]
    out = run_benchmark("many_streams", *args)
    assert "50 streams x 5 entries, 2 processes each side" in out, out
    assert re.search(r"^## many streams on the cluster \(3 primaries\)$", out, re.MULTILINE), out
    assert "| round | bare entries/s | streamjobs entries/s | ratio streamjobs/bare |" in out
    assert re.search(rf"^\| 1 \| {ROW}$", out, re.MULTILINE), out
    assert re.search(r"^median ratio streamjobs/bare: \d+\.\d{3}$", out, re.MULTILINE), out


@pytest.mark.usefixtures("require_cluster_binaries")
def test_idle_cost_on_the_cluster() -> None:
    args = ["--streams", "20", "--wakeups", "5", "--window-s", "0.5", "--liveness", "session"]
    out = run_benchmark("idle_cost", *args, "--cluster")
    assert "20 idle streams owned by one consumer (lock TTL 10 s, 3 + 3 cluster" in out, out
    row = re.search(r"^\| session, cluster \| (\d+) \| ", out, re.MULTILINE)
    assert row is not None, out
    assert int(row.group(1)) <= 20  # the busiest primary's connections, not one per stream
