"""docs/testing.md's example runs as a user runs it: pytest on
examples/testing/test_orders.py, with no Redis server anywhere on the PATH."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from streamjobs.testing import SERVER_ENV_VAR

ROOT = Path(__file__).resolve().parents[2]
SERVERS = ("redis-server", "valkey-server")


def test_the_testing_example_passes_with_no_server_on_the_path() -> None:
    dirs = os.environ.get("PATH", "").split(os.pathsep)
    path = os.pathsep.join(d for d in dirs if not any(Path(d, s).exists() for s in SERVERS))
    assert all(shutil.which(s, path=path) is None for s in SERVERS)
    env = {k: v for k, v in os.environ.items() if k not in (SERVER_ENV_VAR, "PYTHONPATH")}
    r = subprocess.run(
        # Without this project's own test plugins (pytest-timeout here), as a user who
        # installed only the testing extra and pytest: the example must not need them.
        [sys.executable, "-m", "pytest", "examples/testing/test_orders.py", "-q",
         "-p", "no:cacheprovider", "-p", "no:timeout"],
        cwd=ROOT, env={**env, "PATH": path}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 passed" in r.stdout
