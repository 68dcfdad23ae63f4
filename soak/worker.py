"""The consumer the soak's worker processes run (``streamjobs worker soak.worker:SoakWorker``).

Every ``handle()`` call is recorded twice on the *side server* (a Redis the chaos never
touches, named by ``$SOAK_RECORD_URL``): an ``E`` (enter) record, pushed before the
simulated work starts, and an ``X`` (exit) record with the call's outcome, pushed when it
ends (also when it raises or is cancelled). Both are awaited ``RPUSH`` replies, so a
record exists once the call went past that point, whatever happens to the process
afterwards: a call that was killed mid-work has an enter record and no exit record.

The hooks are recorded too: ``S`` (``on_stream_start``: a new *ownership episode*
begins), ``L`` (``on_stream_lost``) and ``F`` (``on_stream_end``).

One record is one string, ``|``-separated (stream names and consumer names never
contain ``|``)::

    kind|consumer|episode|stream|entry_id|attempt|unix_ns|status

``episode`` is ``<consumer>#<n>``: the n-th ``on_stream_start`` of that consumer; a
call belongs to the episode its stream was in when the call entered. ``status`` (exit
records only) is ``ok``, ``error`` (the handler raised) or ``cancel``.

The simulated work: sleep ``info["work_ms"]``; an entry with field ``poison=1`` always
raises (it ends in the dead-letter stream as ``handler_failed``); one with ``flaky=1``
raises on its first attempt only.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any, Final

import anyio
from redis.asyncio import Redis

from streamjobs import Message, StreamConsumer

RECORD_URL_ENV: Final = "SOAK_RECORD_URL"
EVENTS_KEY: Final = "soak:events"
"""List on the side server: every record, in the order the side server received them."""
HANDLED_KEY: Final = "soak:handled"
"""Counter on the side server: handle() calls that returned (for progress lines)."""

START, ENTER, EXIT, LOST, END = "S", "E", "X", "L", "F"
OK, ERROR, CANCEL = "ok", "error", "cancel"


class PoisonError(Exception):
    """Raised by the handler for every attempt on a ``poison=1`` entry."""


class FlakyError(Exception):
    """Raised by the handler on the first attempt on a ``flaky=1`` entry."""


def record(
    kind: str,
    consumer: str,
    episode: str,
    stream: str,
    entry_id: str = "",
    attempt: int = 0,
    t_ns: int = 0,
    status: str = "",
) -> str:
    return f"{kind}|{consumer}|{episode}|{stream}|{entry_id}|{attempt}|{t_ns}|{status}"


class SoakWorker(StreamConsumer):
    """Records every handle() call and hook on the side server (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # No I/O here; the client connects on first use. It is never closed: the
        # process ends with the consumer.
        self._soak_side = Redis.from_url(os.environ[RECORD_URL_ENV])
        self._soak_episodes: dict[str, str] = {}
        self._soak_started = 0

    async def _soak_push(self, rec: str, *, handled: bool = False) -> None:
        # Shielded: a cancelled call still gets its exit record.
        with anyio.CancelScope(shield=True):
            if handled:
                async with self._soak_side.pipeline(transaction=True) as pipe:
                    pipe.rpush(EVENTS_KEY, rec)
                    pipe.incr(HANDLED_KEY)
                    await pipe.execute()
            else:
                await self._soak_side.rpush(EVENTS_KEY, rec)

    def _soak_episode(self, stream: str) -> str:
        return self._soak_episodes.get(stream, f"{self.consumer_name}#0")

    async def handle(self, message: Message) -> None:
        me = self.consumer_name
        stream, entry_id, attempt = message.stream, message.id, message.attempt
        episode = self._soak_episode(stream)
        await self._soak_push(record(ENTER, me, episode, stream, entry_id, attempt, time.time_ns()))
        status = CANCEL
        try:
            await anyio.sleep(float(message.info.get("work_ms", 10)) / 1000)
            if message.fields.get("poison") == "1":
                raise PoisonError(f"poison entry {entry_id}")
            if message.fields.get("flaky") == "1" and attempt == 1:
                raise FlakyError(f"flaky entry {entry_id}, attempt {attempt}")
            status = OK
        except Exception:
            status = ERROR
            raise
        finally:
            rec = record(EXIT, me, episode, stream, entry_id, attempt, time.time_ns(), status)
            await self._soak_push(rec, handled=status == OK)

    async def on_stream_start(self, stream: str, info: Mapping[str, Any]) -> None:
        self._soak_started += 1
        episode = f"{self.consumer_name}#{self._soak_started}"
        self._soak_episodes[stream] = episode
        await self._soak_push(
            record(START, self.consumer_name, episode, stream, t_ns=time.time_ns())
        )

    async def on_stream_lost(self, stream: str) -> None:
        episode = self._soak_episode(stream)
        await self._soak_push(
            record(LOST, self.consumer_name, episode, stream, t_ns=time.time_ns())
        )

    async def on_stream_end(self, stream: str) -> None:
        episode = self._soak_episode(stream)
        await self._soak_push(record(END, self.consumer_name, episode, stream, t_ns=time.time_ns()))
