"""Every file in examples/ runs and does what it says (docs that cannot drift).

``examples/demo.py`` has tests of its own, in test_demo.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_transcriber_example_runs(redis_url: str) -> None:
    r = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "transcriber.py"), redis_url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[-1] == "all 3 streams finished"
    assert sum(1 for line in lines if line.startswith("end   ")) == 3
    # Order within each stream is strict.
    for i in range(3):
        chunks = [
            line.split()[-1]
            for line in lines
            if line.strip().startswith("call:") and line.strip().split()[0].endswith(f":{i}")
        ]
        assert chunks == ["chunk-0", "chunk-1", "chunk-2"]
