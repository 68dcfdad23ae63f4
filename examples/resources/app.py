"""A consumer that needs a resource: opened in ``on_startup``, closed in
``on_shutdown``, and given to it by a factory that ``streamjobs worker`` calls.

The resource here is an append-only archive file (one JSON line per entry); in a real
service it is a database pool or an HTTP client. Run it as a worker:

    ARCHIVE_PATH=/tmp/archive.jsonl PYTHONPATH=examples \\
        streamjobs worker resources.app:make --service archive

``make`` gets the worker's Redis client, service and settings as keyword arguments
(``redis``, ``service``, ``config``, ``recovery``, ``cluster_mode``,
``consumer_name``, ``metrics``) and passes them on whole.
"""

from __future__ import annotations

import json
import os
from typing import Any

import anyio

from streamjobs import Message, StreamConsumer


class Archiver(StreamConsumer):
    """Writes every entry to the archive, one JSON line each."""

    def __init__(self, redis: Any, *, archive_path: str, **settings: Any) -> None:
        super().__init__(redis, **settings)
        self.archive_path = archive_path
        self.archive: anyio.AsyncFile[str] | None = None

    async def on_startup(self) -> None:
        # Before the first stream is taken: a failure here stops the worker with one
        # line naming this hook, having taken nothing.
        self.archive = await anyio.open_file(self.archive_path, "a", encoding="utf-8")

    async def handle(self, message: Message) -> None:
        assert self.archive is not None
        line = {"stream": message.stream, "id": message.id, **message.fields}
        await self.archive.write(json.dumps(line) + "\n")
        await self.archive.flush()

    async def on_shutdown(self) -> None:
        # After every stream was handed back or finished: no handler runs any more.
        if self.archive is not None:
            await self.archive.aclose()


def make(**settings: Any) -> Archiver:
    """The factory: ``streamjobs worker resources.app:make --service archive``."""
    return Archiver(archive_path=os.environ.get("ARCHIVE_PATH", "archive.jsonl"), **settings)
