"""Consumers run as subprocesses by the fault tests (``streamjobs worker`` targets).

Every completed entry is recorded in Redis (``RPUSH faults:<service>:log``) as
``consumer|stream|entry_id|unix_ms`` so the test can check the history after
processes were killed, stopped or cut off.
"""

from __future__ import annotations

import os
import signal
import time

import anyio

from streamjobs import DeadLetter, Message, StreamConsumer


def log_key(service: str) -> str:
    return f"faults:{service}:log"


class RecordingWorker(StreamConsumer):
    """Sleeps ``info["work_ms"]`` per entry, then records it."""

    async def handle(self, message: Message) -> None:
        await anyio.sleep(float(message.info.get("work_ms", 20)) / 1000)
        record = f"{self.consumer_name}|{message.stream}|{message.id}|{int(time.time() * 1000)}"
        await self.redis.rpush(log_key(self.service), record)


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
        await self.redis.rpush(begun_key(self.service), message.id)
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
