"""mypy --strict and ruff run as part of the test command, so CI enforces them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


def test_mypy_strict() -> None:
    r = run("mypy")
    assert r.returncode == 0, r.stdout + r.stderr


def test_ruff_lint_and_format() -> None:
    r = run("ruff", "check", ".")
    assert r.returncode == 0, r.stdout + r.stderr
    r = run("ruff", "format", "--check", ".")
    assert r.returncode == 0, r.stdout + r.stderr
