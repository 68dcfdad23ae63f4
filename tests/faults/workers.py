"""Consumers run as subprocesses by the fault tests (``streamjobs worker`` targets).

Every completed entry is recorded in Redis (``RPUSH faults:<service>:log``) as
``consumer|stream|entry_id|unix_ms`` so the test can check the history after
processes were killed, stopped or cut off.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import anyio
import anyio.lowlevel
from redis.asyncio import Redis
from redis.exceptions import BusyLoadingError, ConnectionError, TimeoutError

from streamjobs import DeadLetter, GroupConsumer, Message, StreamConsumer

RECORD_DEADLINE_S = 60.0
"""How long a record waits for Redis to come back (a restart, an AOF load)."""


async def push_record(redis: Redis, key: str, value: str) -> None:
    """``RPUSH key value``, again while Redis is restarting or loading: a record is the
    test's evidence, not the work, so a server the test restarts must not fail the
    entry (and dead-letter it after ``max_handler_attempts``). A reply lost after the
    push may record it twice; the tests count distinct records."""
    deadline = time.monotonic() + RECORD_DEADLINE_S
    while True:
        try:
            await redis.rpush(key, value)
            return
        except (ConnectionError, TimeoutError, BusyLoadingError):
            if time.monotonic() > deadline:
                raise
            await anyio.sleep(0.05)


def log_key(service: str) -> str:
    return f"faults:{service}:log"


class RecordingWorker(StreamConsumer):
    """Sleeps ``info["work_ms"]`` per entry, then records it."""

    async def handle(self, message: Message) -> None:
        await anyio.sleep(float(message.info.get("work_ms", 20)) / 1000)
        record = f"{self.consumer_name}|{message.stream}|{message.id}|{int(time.time() * 1000)}"
        await push_record(self.redis, log_key(self.service), record)


class PoisonWorker(RecordingWorker):
    """Dies hard (SIGKILL of its own process) on any stream whose info says poison."""

    async def handle(self, message: Message) -> None:
        if message.info.get("poison"):
            os.kill(os.getpid(), signal.SIGKILL)
        await super().handle(message)


def begun_key(service: str) -> str:
    return f"faults:{service}:begun"


class AnnouncingWorker(RecordingWorker):
    """Records each entry's id in ``faults:<service>:begun`` as its handler starts."""

    async def handle(self, message: Message) -> None:
        await push_record(self.redis, begun_key(self.service), message.id)
        await super().handle(message)


class RejectingWorker(RecordingWorker):
    """Dead-letters entries ``n == "bad"`` (``DeadLetter``); the consumer named ``c0``
    dies hard on ``n == "die"``, which comes in the same batch: the dead letter of
    "bad" is then written and the entry itself not acked yet."""

    async def handle(self, message: Message) -> None:
        n = message.fields.get("n")
        if n == "bad":
            raise DeadLetter("rejected by the handler")
        if n == "die" and self.consumer_name == "c0":
            os.kill(os.getpid(), signal.SIGKILL)
        await super().handle(message)


def lifecycle_key(service: str) -> str:
    return f"faults:{service}:lifecycle"


class PooledWorker(RecordingWorker):
    """Needs a resource of its own (``db_url``): built by :func:`make_pooled`. Its
    lifecycle hooks record, in Redis, when they ran against what it owned then."""

    def __init__(self, *args: Any, db_url: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.db_url = db_url
        self.pool: list[str] | None = None

    async def on_startup(self) -> None:
        self.pool = [self.db_url]
        await push_record(
            self.redis, lifecycle_key(self.service), f"startup owned={len(self.owned_streams)}"
        )

    async def handle(self, message: Message) -> None:
        assert self.pool is not None, "handle() before on_startup()"
        await super().handle(message)

    async def on_shutdown(self) -> None:
        self.pool = None
        await push_record(
            self.redis, lifecycle_key(self.service), f"shutdown owned={len(self.owned_streams)}"
        )


def make_pooled(**settings: Any) -> PooledWorker:
    """A factory: what ``streamjobs worker tests.faults.workers:make_pooled`` runs."""
    return PooledWorker(db_url=os.environ.get("POOL_DB_URL", "db://default"), **settings)


async def make_pooled_async(**settings: Any) -> PooledWorker:
    await anyio.lowlevel.checkpoint()
    return make_pooled(**settings)


class FailingStartup(RecordingWorker):
    """``on_startup`` fails (a database that is not there); ``on_shutdown`` records."""

    async def on_startup(self) -> None:
        raise ConnectionRefusedError("database at db://nowhere refused the connection")

    async def on_shutdown(self) -> None:
        await push_record(self.redis, lifecycle_key(self.service), "shutdown")


class GroupRecordingWorker(GroupConsumer):
    """A shared-group consumer (streams from ``--stream``). Records each handler's start
    in ``faults:<service>:begun`` and each completion in the log, like
    :class:`RecordingWorker`. An entry's fields drive it: ``work_ms`` (default 20) is
    how long it works; ``poison=1`` raises every time; ``crash=1`` kills the process
    (SIGKILL) in the handler."""

    async def handle(self, message: Message) -> None:
        fields = message.fields
        await push_record(self.redis, begun_key(self.service), f"{self.consumer_name}|{message.id}")
        if fields.get("crash"):
            os.kill(os.getpid(), signal.SIGKILL)
        if fields.get("poison"):
            raise ValueError(f"poison entry {message.id}")
        await anyio.sleep(float(fields.get("work_ms", 20)) / 1000)
        record = f"{self.consumer_name}|{message.stream}|{message.id}|{int(time.time() * 1000)}"
        await push_record(self.redis, log_key(self.service), record)
