"""The chaos soak (``python -m tests.soak``, see tests/soak/README.md) as part of the suite: a short
run on a private standalone server and one on a private 3+3 cluster.

Each run is a subprocess, started as the README shows (from the repository root); it
fails with the soak's own report when a check fails. The seed is random unless
``SOAK_SEED`` is set; it is printed in the report, so a failure can be replayed with
``python -m tests.soak --target ... --seed N`` (the fault sequence, not the exact timing).
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SUMMARY = re.compile(
    r"^summary: target=(?P<target>\S+) seed=(?P<seed>\d+) jobs=(?P<jobs>\d+) "
    r"names=(?P<names>\d+) entries=(?P<entries>\d+) handled=(?P<handled>\d+) "
    r"duplicates=(?P<duplicates>\d+) dead_letters=(?P<dead_letters>\d+) "
    r"foreign=(?P<foreign>\d+) lost=(?P<lost>\d+) overlaps=(?P<overlaps>\d+) "
    r"faults=(?P<faults>\d+) result=(?P<result>PASS|FAIL)(?: failed=(?P<failed>\S+))?$",
    re.MULTILINE,
)
# Faults every 1.5-3.5 s instead of 2-5 s: a short run still sees most kinds.
SHORT = ["--fault-min-s", "1.5", "--fault-max-s", "3.5", "--progress-s", "5"]


def run_soak(target: str, duration_s: float, timeout_s: float) -> dict[str, str]:
    seed = os.environ.get("SOAK_SEED") or str(secrets.randbelow(2**31))
    argv = ["--target", target, "--duration-s", str(duration_s), "--seed", seed, *SHORT]
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "tests.soak", *argv],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else ""
        pytest.fail(f"the soak did not end within {timeout_s:g}s (seed {seed}):\n{out[-20000:]}")
    # Worker warnings are in the workers' logs, not here: the output is the soak's own.
    report = proc.stdout[-30000:] + (f"\nstderr:\n{proc.stderr[-5000:]}" if proc.stderr else "")
    match = SUMMARY.search(proc.stdout)
    summary = match.groupdict() if match else {}
    if match is None or proc.returncode != 0:
        pytest.fail(
            f"python -m tests.soak {' '.join(argv)} exited with {proc.returncode}:\n{report}",
            pytrace=False,
        )
    print(f"\n{match.group(0)}")
    assert int(summary["faults"]) > 0, report
    assert int(summary["handled"]) > 0, report
    assert int(summary["jobs"]) > int(summary["names"]), report  # names were reused
    assert summary["result"] == "PASS", report
    assert summary["lost"] == "0", report
    assert summary["foreign"] == "0", report
    assert summary["overlaps"] == "0", report
    return summary


@pytest.mark.timeout(240)
def test_soak_standalone(require_redis_server: str) -> None:
    run_soak("standalone", duration_s=20, timeout_s=200)


@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_soak_cluster(require_cluster_binaries: None) -> None:
    run_soak("cluster", duration_s=25, timeout_s=260)
