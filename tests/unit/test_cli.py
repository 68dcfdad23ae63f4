"""The worker command's one-line errors (no traceback) for bad input."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from streamjobs.cli import CliError, load_consumer_class

ROOT = Path(__file__).resolve().parents[2]


def worker(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "streamjobs", "worker", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("no_such_module_xyz:C", "cannot import module 'no_such_module_xyz'"),
        ("streamjobs:Nope", "has no attribute 'Nope'"),
        ("streamjobs:Producer", "is not a StreamConsumer subclass"),
        ("streamjobs:StreamConsumer", "does not implement handle()"),
        ("nocolon", "expected MODULE:CLASS"),
    ],
)
def test_bad_targets_give_one_line_errors(target: str, message: str) -> None:
    with pytest.raises(CliError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_consumer_class(target)
    r = worker(target, "--service", "s")
    assert r.returncode == 2
    assert message in r.stderr
    assert "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_unreachable_redis_is_one_line() -> None:
    r = worker(
        "tests.faults.workers:RecordingWorker",
        "--service",
        "s",
        "--redis-url",
        "redis://127.0.0.1:1/0",
    )
    assert r.returncode == 2
    assert "cannot reach Redis at redis://127.0.0.1:1/0" in r.stderr
    assert "Traceback" not in r.stderr


def test_invalid_configuration_names_the_field() -> None:
    r = worker("tests.faults.workers:RecordingWorker", "--service", "s", "--lock-ttl", "-1")
    assert r.returncode == 2
    assert "lock_ttl_s" in r.stderr
    assert "Traceback" not in r.stderr
