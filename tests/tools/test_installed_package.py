"""The installed package as a user's own process sees it: what importing it loads, and
what mypy sees of it from a project in another folder."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import streamjobs


def test_testing_is_a_public_submodule_with_light_imports() -> None:
    """``streamjobs.testing`` is imported on request only, and imports nothing but the
    standard library, redis-py and the exception tree (never the consumer runtime)."""
    probe = "import sys, streamjobs; print('streamjobs.testing' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "False", r.stdout + r.stderr

    imported: set[str] = set()
    for path in (Path(streamjobs.__file__).parent / "testing").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 1:
                pass  # its own modules
            elif isinstance(node, ast.ImportFrom) and node.level:
                # Both are standard-library only: the exception tree, and URL redaction.
                assert node.module in {"exceptions", "_urls"}, (
                    f"{path.name} of streamjobs.testing imports ..{node.module}"
                )
            elif isinstance(node, ast.ImportFrom):
                imported.add((node.module or "").split(".")[0])
    # fakeredis: only inside fake_redis(), when it is called (the testing extra).
    assert imported - {"__future__", "redis", "fakeredis"} <= sys.stdlib_module_names
    probe = "import sys, streamjobs.testing; print('fakeredis' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "False", r.stdout + r.stderr


def test_mypy_in_a_users_own_project_sees_the_installed_package(tmp_path: Path) -> None:
    """After the documented ``pip install -e .``, a project in another folder type-checks
    against streamjobs (an import-hook editable install would leave mypy blind: it
    reported ``Cannot find implementation or library stub for module named
    "streamjobs"``), bytes mode included."""
    (tmp_path / "app.py").write_text(
        "from streamjobs import Message, StreamConsumer\n\n\n"
        "class Text(StreamConsumer):\n"
        "    async def handle(self, message: Message) -> None:\n"
        "        print(message.fields['n'].upper())\n\n\n"
        "class Raw(StreamConsumer[bytes]):\n"
        "    async def handle(self, message: Message[bytes]) -> None:\n"
        "        print(message.fields[b'n'].hex())\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MYPYPATH")}
    r = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "app.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    # A wrong use is caught: the types are really there, not Any.
    (tmp_path / "bad.py").write_text(
        "from streamjobs import Message\n\n\n"
        "def f(message: Message[bytes]) -> str:\n"
        "    return message.fields[b'n']\n"
    )
    r = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "bad.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert r.returncode == 1
    assert 'Incompatible return value type (got "bytes", expected "str")' in r.stdout
