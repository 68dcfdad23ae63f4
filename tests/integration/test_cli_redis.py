"""The CLI and the demo against real servers: TLS spoken to a plaintext server, and
passwords that never reach the output."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from streamjobs.cli import CliError, check_connection, connect
from streamjobs.testing import RedisServer
from tests.harness.plugin import RedisServerFactory

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "examples" / "demo.py"
PASSWORD = "S3cretPW-demo7"


@pytest.mark.anyio
async def test_tls_to_a_plaintext_server_says_the_handshake_failed(redis_url: str) -> None:
    if not redis_url.startswith("redis://"):
        pytest.skip("needs a plaintext redis:// server")
    url = "rediss://" + redis_url.removeprefix("redis://")
    client = connect(url, cluster=False, timeout_s=0.5)
    started = time.monotonic()
    try:
        with pytest.raises(CliError) as caught:
            await check_connection(client, url, timeout_s=5)
    finally:
        await client.aclose()
    message = str(caught.value)
    assert message.startswith(f"cannot reach Redis at {url}: the TLS handshake failed ")
    assert "the server may not speak TLS" in message
    assert "\n" not in message
    assert time.monotonic() - started < 5, "the connect timeout was not used"


@pytest.mark.anyio
async def test_a_wrong_password_is_not_taken_for_a_tls_failure(
    redis_server_factory: RedisServerFactory,
) -> None:
    server = redis_server_factory(password=PASSWORD)
    url = f"redis://default:wrong-{PASSWORD}@127.0.0.1:{server.port}/0"
    client = connect(url, cluster=False, timeout_s=2)
    try:
        with pytest.raises(CliError) as caught:
            await check_connection(client, url, timeout_s=5)
    finally:
        await client.aclose()
    message = str(caught.value)
    assert "TLS" not in message
    assert PASSWORD not in message
    assert message.startswith(
        f"cannot reach Redis at redis://default:***@127.0.0.1:{server.port}/0"
    )
    # The right one connects.
    good = connect(server.url, cluster=False, timeout_s=2)
    try:
        await check_connection(good, server.url, timeout_s=5)
    finally:
        await good.aclose()


def _demo(
    env: dict[str, str], *args: str, timeout_s: float = 90
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(DEMO), *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=ROOT,
        env={**os.environ, **env},
        check=False,
    )


@pytest.mark.faults
def test_the_demo_never_prints_its_password(redis_server_factory: RedisServerFactory) -> None:
    server: RedisServer = redis_server_factory(password=PASSWORD)
    good = _demo(
        {"STREAMJOBS_REDIS_URL": server.url},
        "--consumers",
        "1",
        "--streams",
        "1",
        "--entries",
        "2",
        "--lock-ttl",
        "2",
    )
    output = good.stdout + good.stderr
    assert good.returncode == 0, output
    assert PASSWORD not in output
    assert f"Redis redis://default:***@127.0.0.1:{server.port}/0" in good.stdout, output
    assert "private redis-server" not in output

    # A wrong password is an error, not a reason to fall back to a private server.
    bad_url = f"redis://default:wrong-{PASSWORD}@127.0.0.1:{server.port}/0"
    bad = _demo({}, "--redis-url", bad_url, timeout_s=30)
    assert bad.returncode == 2, bad.stdout + bad.stderr
    assert PASSWORD not in bad.stdout + bad.stderr
    lines = bad.stderr.strip().splitlines()
    assert len(lines) == 1, bad.stderr
    assert "refused the connection" in lines[0]
    assert "private redis-server" not in bad.stdout
