"""The chaos soak (``python -m soak``, see soak/README.md) as part of the suite: a short
run on a private standalone server and one on a private 3+3 cluster.

Each run is a subprocess, started as the README shows (from the repository root); it
fails with the soak's own report when a check fails. The seed is random unless
``SOAK_SEED`` is set; it is printed in the report, so a failure can be replayed with
``python -m soak --target ... --seed N`` (the fault sequence, not the exact timing).
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.faults

ROOT = Path(__file__).resolve().parents[2]
SUMMARY = re.compile(
    r"^summary: target=(?P<target>\S+) seed=(?P<seed>\d+) streams=(?P<streams>\d+) "
    r"entries=(?P<entries>\d+) handled=(?P<handled>\d+) duplicates=(?P<duplicates>\d+) "
    r"dead_letters=(?P<dead_letters>\d+) lost=(?P<lost>\d+) overlaps=(?P<overlaps>\d+) "
    r"faults=(?P<faults>\d+) result=(?P<result>PASS|FAIL)(?: failed=(?P<failed>\S+))?$",
    re.MULTILINE,
)
# Two streamjobs defects the soak finds now and then (soak/README.md, "Known streamjobs
# defects"). A run that fails only with their signatures is an xfail; any other failed
# check fails the test.
# 1. The release after finish.lua never runs (owner killed between them, or its lock
#    expired while the data stream's node failed over): the finished data stream keeps
#    its last batch pending and never gets its retention TTL.
RELEASE_NEVER_RAN = {"left_behind_data"}
# 2. A consumer stalled between reading an assignment and taking its lock (SIGSTOP) runs
#    a job the scan had already re-queued: the copy is a second job for the same stream,
#    started after the stream finished; it waits for entries forever (so the fleet does
#    not drain, and its assignment, lock and the stream's missing TTL are left behind).
RERUN = "rerun_finished"
RERUN_CONSEQUENCES = {RERUN, "drain", "left_behind_keys", "left_behind_data"}
KNOWN_DEFECT_REASON = {
    "release": "streamjobs defect: a stream whose release after finish.lua never runs "
    "keeps its last batch pending and no retention TTL",
    "rerun": "streamjobs defect: an assignment re-queued by the scan while its reader was "
    "stalled before acquiring is run twice; the second job never ends",
}


def known_defect(failed: set[str]) -> str | None:
    """The known defect a failed run shows, or None if anything else failed."""
    if failed == RELEASE_NEVER_RAN:
        return KNOWN_DEFECT_REASON["release"]
    if RERUN in failed and failed <= RERUN_CONSEQUENCES:
        return KNOWN_DEFECT_REASON["rerun"]
    return None


# Faults every 1.5-3.5 s instead of 2-5 s: a short run still sees most kinds.
SHORT = ["--fault-min-s", "1.5", "--fault-max-s", "3.5", "--progress-s", "5"]


def run_soak(target: str, duration_s: float, timeout_s: float) -> dict[str, str]:
    seed = os.environ.get("SOAK_SEED") or str(secrets.randbelow(2**31))
    argv = ["--target", target, "--duration-s", str(duration_s), "--seed", seed, *SHORT]
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "soak", *argv],
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
    defect = known_defect(set((match.group("failed") or "").split(","))) if match else None
    if defect is not None:
        print(f"\n{report}")
        pytest.xfail(defect)
    if proc.returncode != 0 or match is None:
        pytest.fail(
            f"python -m soak {' '.join(argv)} exited with {proc.returncode}:\n{report}",
            pytrace=False,
        )
    summary = match.groupdict()
    print(f"\n{match.group(0)}")
    assert summary["result"] == "PASS", report
    assert summary["lost"] == "0", report
    assert summary["overlaps"] == "0", report
    assert int(summary["faults"]) > 0, report
    assert int(summary["handled"]) > 0, report
    return summary


@pytest.mark.timeout(240)
def test_soak_standalone(require_redis_server: str) -> None:
    run_soak("standalone", duration_s=20, timeout_s=200)


@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_soak_cluster(require_cluster_binaries: None) -> None:
    run_soak("cluster", duration_s=25, timeout_s=260)
