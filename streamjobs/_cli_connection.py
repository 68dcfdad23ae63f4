"""The command line's connection to Redis, the same for every command: which URL (checked,
and shown only with its password masked), the client, and the PING that proves it works.

The Redis URL comes from ``--redis-url``, else ``--redis-url-file``, else the
``STREAMJOBS_REDIS_URL`` environment variable (else the file its ``_FILE`` twin names),
else :data:`DEFAULT_URL` (docs/operations.md#connecting-and-secrets).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio

from ._cli_errors import CliError
from ._redis._admin import is_tls_failure, ping
from ._urls import ENV_VAR, BadRedisURL, check, redact, scrub

DEFAULT_URL = "redis://127.0.0.1:6379/0"
CONNECT_TIMEOUT_S = 5.0
PING_TIMEOUT_S = 10.0


def redis_url(ns: argparse.Namespace, env: Mapping[str, str] = os.environ) -> str:
    """The URL the options and environment ask for, checked.

    Raises:
        CliError: both a URL and a file were given, the file cannot be read or is
            empty, or the URL is malformed (said without its password).
    """
    if ns.redis_url is not None and ns.redis_url_file is not None:
        raise CliError("give --redis-url or --redis-url-file, not both")
    if ns.redis_url is not None:
        url, source = ns.redis_url, "--redis-url"
    elif ns.redis_url_file is not None:
        try:
            url = Path(ns.redis_url_file).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise CliError(f"--redis-url-file: cannot read {ns.redis_url_file}: {exc}") from None
        except UnicodeDecodeError:  # its message would quote the file's bytes
            raise CliError(f"--redis-url-file: {ns.redis_url_file} is not UTF-8 text") from None
        if not url:
            raise CliError(f"--redis-url-file: {ns.redis_url_file} is empty")
        source = "--redis-url-file"
    elif env.get(ENV_VAR):
        url, source = env[ENV_VAR].strip(), ENV_VAR
    elif env.get(ENV_VAR + "_FILE"):
        path = env[ENV_VAR + "_FILE"]
        source = ENV_VAR + "_FILE"
        try:
            url = Path(path).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise CliError(f"{source}: cannot read {path}: {exc}") from None
    else:
        url, source = DEFAULT_URL, "the default URL"
    try:
        return check(url)
    except BadRedisURL as exc:
        raise CliError(f"{source}: {exc}") from None


def connect(url: str, *, cluster: bool, timeout_s: float = CONNECT_TIMEOUT_S) -> Any:
    """A client for ``url`` (not connected yet); connecting gives up after ``timeout_s``."""
    if cluster:
        from redis.asyncio.cluster import RedisCluster

        return RedisCluster.from_url(url, socket_connect_timeout=timeout_s)
    from redis.asyncio import Redis

    return Redis.from_url(url, socket_connect_timeout=timeout_s, health_check_interval=10)


async def check_connection(client: Any, url: str, *, timeout_s: float = PING_TIMEOUT_S) -> None:
    """PING through ``client``.

    Raises:
        CliError: no answer within ``timeout_s`` or an error, said without the URL's
            password; for a ``rediss://`` URL whose handshake fails or times out, that
            the server may not speak TLS.
    """
    try:
        with anyio.fail_after(timeout_s):
            try:
                await ping(client)
            except (ConnectionError, OSError):
                # Once more: a connection the server dropped as we started (a restart,
                # CLIENT KILL) is no reason to give up; a refused one is refused again.
                await anyio.sleep(0.2)
                await ping(client)
    except Exception as exc:
        why = str(exc) or type(exc).__name__
        if url.startswith("rediss://") and is_tls_failure(exc):
            why = (
                f"the TLS handshake failed ({why}): the server may not speak TLS; "
                "use redis:// for a plaintext server"
            )
        raise CliError(f"cannot reach Redis at {redact(url)}: {scrub(why, url)}") from None
