"""The consumer the soak's worker processes run
(``streamjobs worker tests.soak.worker:SoakWorker``).

Every ``handle()`` call is recorded twice on the *side server* (a Redis the chaos never
touches, named by ``$SOAK_RECORD_URL``): an ``E`` (enter) record, pushed before the
simulated work starts, and an ``X`` (exit) record with the call's outcome, pushed when it
ends (also when it raises or is cancelled). Both are awaited ``RPUSH`` replies, so a
record exists once the call went past that point, whatever happens to the process
afterwards: a call that was killed mid-work has an enter record and no exit record.

The hooks are recorded too: ``S`` (``on_stream_start``: a new *ownership episode*
begins), ``L`` (``on_stream_lost``), ``F`` (``on_stream_end``) and ``C``
(``on_stream_cancelled``).

One record is one string, ``|``-separated (stream names and consumer names never
contain ``|``)::

    kind|consumer|episode|stream|entry_id|attempt|unix_ns|status|entry_job|info_job|replayed_from

``episode`` is ``<consumer>#<n>``: the n-th ``on_stream_start`` of that consumer; a
call belongs to the episode its stream was in when the call entered. ``status`` (exit
records only) is ``ok``, ``error`` (the handler raised), ``reject`` (it raised
``DeadLetter``) or ``cancel``. The last three fields tie a call to a *job*: the
entry's own ``job`` field (the job the producer appended it to), ``message.info["job"]``
(the job the framework handed it to) and ``message.replayed_from`` (set on a copy a
dead-letter replay put back). An ``S`` record carries the job of the assignment in
``info_job``. Records of the old, eight-field form still parse (the job fields empty).

The simulated work: sleep ``info["work_ms"]``; then an entry with field ``poison=1``
always raises (it ends in the dead-letter stream as ``handler_failed``); one with
``reject=1`` raises ``DeadLetter("soak reject")`` unless it is a replayed copy (which
succeeds); one with ``flaky=1`` raises on its first attempt only; after an entry with
``finish=1`` the handler calls ``self.finish(stream)`` (the job ends early).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any, Final

import anyio
from redis.asyncio import Redis

from streamjobs import DeadLetter, GroupConsumer, Message, StreamConsumer

RECORD_URL_ENV: Final = "SOAK_RECORD_URL"
EVENTS_KEY: Final = "soak:events"
"""List on the side server: every record, in the order the side server received them."""
GROUP_EVENTS_KEY: Final = "soak:group_events"
"""List on the side server: the group workers' records (``GroupSoakWorker``)."""
HANDLED_KEY: Final = "soak:handled"
"""Counter on the side server: handle() calls that returned (for progress lines)."""

REJECT_REASON: Final = "soak reject"
"""The reason the handler gives ``DeadLetter`` for a ``reject=1`` entry: the replayer
finds exactly these dead letters by it (``DeadLetterFilter(reason=REJECT_REASON)``)."""

START, ENTER, EXIT, LOST, END, CANCELLED = "S", "E", "X", "L", "F", "C"
OK, ERROR, REJECT, CANCEL = "ok", "error", "reject", "cancel"


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
    *,
    entry_job: str = "",
    info_job: str = "",
    replayed_from: str = "",
) -> str:
    return (
        f"{kind}|{consumer}|{episode}|{stream}|{entry_id}|{attempt}|{t_ns}|{status}"
        f"|{entry_job}|{info_job}|{replayed_from}"
    )


async def push(side: Redis, key: str, rec: str, *, handled: bool = False) -> None:
    """Append ``rec`` to list ``key`` on the side server (and count a handled call),
    shielded: a cancelled call still gets its exit record."""
    with anyio.CancelScope(shield=True):
        if handled:
            async with side.pipeline(transaction=True) as pipe:
                pipe.rpush(key, rec)
                pipe.incr(HANDLED_KEY)
                await pipe.execute()
        else:
            await side.rpush(key, rec)


def job_of(info: Mapping[str, Any]) -> str:
    """The job number an assignment's ``info`` names ('' if none)."""
    job = info.get("job")
    return "" if job is None else str(job)


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
        await push(self._soak_side, EVENTS_KEY, rec, handled=handled)

    def _soak_episode(self, stream: str) -> str:
        return self._soak_episodes.get(stream, f"{self.consumer_name}#0")

    async def handle(self, message: Message) -> None:
        me = self.consumer_name
        stream, entry_id, attempt = message.stream, message.id, message.attempt
        fields = message.fields
        replayed = message.replayed_from or ""
        episode = self._soak_episode(stream)
        enter = record(
            ENTER,
            me,
            episode,
            stream,
            entry_id,
            attempt,
            time.time_ns(),
            entry_job=fields.get("job", ""),
            info_job=job_of(message.info),
            replayed_from=replayed,
        )
        await self._soak_push(enter)
        status = CANCEL
        try:
            await anyio.sleep(float(message.info.get("work_ms", 10)) / 1000)
            if fields.get("poison") == "1":
                raise PoisonError(f"poison entry {entry_id}")
            if fields.get("reject") == "1" and not replayed:
                raise DeadLetter(REJECT_REASON)
            if fields.get("flaky") == "1" and attempt == 1:
                raise FlakyError(f"flaky entry {entry_id}, attempt {attempt}")
            if fields.get("finish") == "1":
                self.finish(stream)
            status = OK
        except DeadLetter:
            status = REJECT
            raise
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
            record(
                START,
                self.consumer_name,
                episode,
                stream,
                t_ns=time.time_ns(),
                info_job=job_of(info),
            )
        )

    async def on_stream_lost(self, stream: str) -> None:
        episode = self._soak_episode(stream)
        await self._soak_push(
            record(LOST, self.consumer_name, episode, stream, t_ns=time.time_ns())
        )

    async def on_stream_end(self, stream: str) -> None:
        episode = self._soak_episode(stream)
        await self._soak_push(record(END, self.consumer_name, episode, stream, t_ns=time.time_ns()))

    async def on_stream_cancelled(self, stream: str, reason: str) -> None:
        episode = self._soak_episode(stream)
        text = reason.replace("|", "/")  # the record's separator
        await self._soak_push(
            record(CANCELLED, self.consumer_name, episode, stream, t_ns=time.time_ns(), status=text)
        )


def group_record(
    kind: str, consumer: str, stream: str, entry_id: str, seq: str, t_ns: int, status: str = ""
) -> str:
    """One record of a group worker's ``handle()`` call::

        kind|consumer|stream|entry_id|seq|unix_ns|status

    ``kind`` is ``E`` (enter) or ``X`` (exit, with ``ok``, ``error`` or ``cancel``);
    ``seq`` is the entry's ``seq`` field (the producer's number for it)."""
    return f"{kind}|{consumer}|{stream}|{entry_id}|{seq}|{t_ns}|{status}"


class GroupSoakWorker(GroupConsumer):
    """The soak's shared-group worker (``streamjobs worker
    tests.soak.worker:GroupSoakWorker --stream ...``): records every ``handle()`` call
    on the side server, enter and exit, as :class:`SoakWorker` does. An entry's fields
    drive it: ``work_ms`` is how long it works; ``poison=1`` always raises (it ends in
    the dead-letter stream as ``handler_failed``); ``flaky=1`` raises on its first
    attempt only."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._soak_side = Redis.from_url(os.environ[RECORD_URL_ENV])

    async def _soak_push(self, rec: str, *, handled: bool = False) -> None:
        await push(self._soak_side, GROUP_EVENTS_KEY, rec, handled=handled)

    async def handle(self, message: Message) -> None:
        me, stream, entry_id = self.consumer_name, message.stream, message.id
        fields = message.fields
        seq = fields.get("seq", "")
        await self._soak_push(group_record(ENTER, me, stream, entry_id, seq, time.time_ns()))
        status = CANCEL
        try:
            await anyio.sleep(float(fields.get("work_ms", 10)) / 1000)
            if fields.get("poison") == "1":
                raise PoisonError(f"poison entry {entry_id}")
            if fields.get("flaky") == "1" and message.attempt == 1:
                raise FlakyError(f"flaky entry {entry_id}")
            status = OK
        except Exception:
            status = ERROR
            raise
        finally:
            rec = group_record(EXIT, me, stream, entry_id, seq, time.time_ns(), status)
            await self._soak_push(rec, handled=status == OK)
