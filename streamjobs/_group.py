"""The runtime of a :class:`~streamjobs.GroupConsumer`: many consumers on one stream
(docs/shared-groups.md).

One *lane* per stream the consumer reads. A lane joins the service's consumer group on
its stream as a *member*: the consumer's name and a fresh incarnation, with a session
deadline in the stream's member index (``Keys.members``), in the stream's slot. The
lane reads (``XREADGROUP >``), hands each entry to the shared entry pipeline
(``_pipeline``: retries, timeout, dead letters) in the order read, and acknowledges
through ``group_ack.lua``, which refuses a member whose session is over.

Two loops serve every lane: the heartbeat renews each member's deadline
(``group_beat.lua``, which never revives a dead member), and the reclaim pass
(``group_reclaim.lua``) claims the entries pending under dead or stopped members, and
under names with no session after ``min_idle_s``. A lane that learns its member is
dead drops what it holds and joins again under a new incarnation: what the old one
held is reclaimed, by it or by another member.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import random
import secrets
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

import anyio
import anyio.abc
from redis.exceptions import NoScriptError

from . import _tracing
from ._backoff import Backoff
from ._cluster_waiter import ClusterWaiter, idle_wait
from ._deadletter import GROUP_FIELD, DeadLetterReason, entry_dead_letter
from ._guard import log_failure
from ._lifespan import Background
from ._pipeline import GiveUp, _call_within, after_failure, entry_caller
from ._redis import Channel, Gateway, translate
from ._redis._boundary import _stream_entries, raw_sized_entries, sized_entries, text
from ._stats import ConsumerStatistics, Tally
from ._waiter import Waiter
from .config import ConsumerConfig, GroupRetention, RecoveryConfig
from .exceptions import HookFailed, RedisUnavailable, StreamJobsError
from .message import Message
from .metrics import EntryOutcome, MetricsRecorder, StreamEvent

log = logging.getLogger("streamjobs.group")

RECLAIM_INTERVAL_S = 0.5
"""Mean pause between two reclaim passes of a consumer (jittered by a quarter either
way): a dead member's entries are claimed within its session TTL plus this, plus a pass."""

ACK_INTERVAL_S = 1.0
"""Longest a handled entry waits for its acknowledgement while its batch goes on."""

FORGET_AFTER_S = 3600.0
"""How long a dead or stopped member with nothing pending stays in the member index
(``streamjobs status`` shows it), before it leaves the index and the group."""

_SETTLE_RETRY_S = 5.0
"""Pause before what a join left to do is tried again, after a failure."""

_NO_ENTRIES: list[tuple[str, Any]] = []


def _log_failure(what: str, exc: BaseException, delay_s: float) -> None:
    """``log_failure`` of what the client raised, as the gateway boundary translates it
    (a lost connection is one line, not a traceback)."""
    log_failure(log, what, translate(exc), delay_s)


def _read_entries(reply: Any, raw: bool) -> list[tuple[str, Any]]:
    """``(id, fields)`` of an ``XREADGROUP`` reply of one stream, parsed or not; fields
    are None for an entry that is pending but no longer in the stream."""
    found = _stream_entries(reply)
    if not found:
        return _NO_ENTRIES
    decode = raw_sized_entries if raw else sized_entries
    if all(item[1] is not None for item in found):
        return decode(found)[0]
    out: list[tuple[str, Any]] = []
    for item in found:
        if item[1] is None:
            out.append((text(item[0]), None))
        else:
            out.extend(decode([item])[0])
    return out


class Lane:
    """One stream of a group consumer (see the module docstring)."""

    def __init__(self, runtime: GroupRuntime, stream: str) -> None:
        self.rt = runtime
        self.stream = stream
        self.members = runtime.gateway.keys.members(stream)
        self.starts = runtime.gateway.keys.starts(stream)
        self.member = ""
        self.dead = True
        """The member is not (or no longer known to be) alive: join again first."""
        self.alive_until = -math.inf
        """``time.monotonic()`` until which the session is surely alive (the send time
        of the last renewal that succeeded, plus the TTL)."""
        self.history = False
        """Entries may be pending under our own member that we do not hold (claimed
        from the dead, or delivered by a read whose reply was lost): read them first."""
        self.stopping = False
        self.to_ack: list[str] = []
        self.last_flush = time.perf_counter()
        self.joined = anyio.Event()
        self.registered = False
        """The stream is in the service's list of group streams (``Keys.group_streams``)."""
        self.orphans: list[str] = []
        """Members of joins whose reply was lost: they may be alive on the server."""
        self.settle_after = -math.inf
        """``_settle_joining`` waits until then after a failure."""
        self._handle_scope: anyio.CancelScope | None = None
        self._pause_scope: anyio.CancelScope | None = None
        self._idle_wake: asyncio.Future[None] | None = None
        self.extra = {"stream": stream, "service": runtime.service}

    # -- state changes, from any task of the consumer --------------------------------

    @property
    def handling(self) -> bool:
        """In the middle of a batch of ``handle()`` calls."""
        return self._handle_scope is not None

    def usable(self) -> bool:
        """The member may hand entries to ``handle()``: alive as far as we know."""
        if self.dead:
            return False
        if time.monotonic() >= self.alive_until:
            # Not renewed within a TTL: it may have expired on the server already.
            self.lose("its session was not renewed within the session TTL")
            return False
        return True

    def lose(self, why: str, member: str | None = None) -> None:
        """The member is dead: hand nothing more to ``handle()``, acknowledge nothing,
        and join again under a new incarnation. ``member``: the member a reply was
        about; a reply about an earlier incarnation (the lane joined again while the
        call was out) says nothing of the current one."""
        if self.dead or (member is not None and member != self.member):
            return
        self.dead = True
        self.to_ack.clear()
        self.rt.metrics.stream_event(self.rt.service, StreamEvent.LOST)
        log.warning(
            "group %r stream %r: member %s is dead (%s); joining again",
            self.rt.service,
            self.stream,
            self.member,
            why,
            extra=self.extra,
        )
        self._wake()

    def claimed(self, count: int) -> None:
        """``count`` entries were claimed for this member: read them next."""
        if count:
            self.history = True
            self._wake()

    def stop(self, grace_s: float) -> None:
        """Stop reading; the call in flight gets ``grace_s`` to return."""
        self.stopping = True
        self._wake()
        if self._handle_scope is not None:
            self._handle_scope.deadline = min(
                self._handle_scope.deadline, anyio.current_time() + grace_s
            )

    def _wake(self) -> None:
        if self._pause_scope is not None:
            self._pause_scope.cancel()
        idle = self._idle_wake
        if idle is not None and not idle.done():
            idle.set_result(None)

    # -- the lane's own task ----------------------------------------------------------

    async def run(self) -> None:
        backoff = Backoff()
        try:
            while not self.stopping:
                try:
                    if self.dead:
                        await self._join()
                    await self._step()
                    backoff.reset()
                except Exception as exc:
                    if self.stopping:
                        break
                    self.rt.metrics.loop_error(self.rt.service, "group")
                    delay = backoff.next_delay()
                    _log_failure(f"group stream {self.stream!r}", exc, delay)
                    # A read may have delivered entries whose reply was lost.
                    self.history = True
                    if "NOGROUP" in str(exc):
                        self.dead = True  # the stream or its group was deleted: join again
                    await self._pause(delay)
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                await self._leave()

    async def _join(self) -> None:
        rt = self.rt
        member = f"{rt.name}~{secrets.token_hex(4)}"
        sent = time.monotonic()
        try:
            await rt.gateway.scripts.group_join(
                keys=[self.stream, self.members],
                args=[rt.group, member, rt.ttl_ms, rt.start_id],
            )
        except Exception:
            # The server may have joined it and the reply been lost: a live member
            # nobody renews. It is made to leave once Redis answers again.
            self.orphans.append(member)
            raise
        self.member = member
        self.alive_until = sent + rt.ttl_s
        self.dead = False
        self.history = False
        self.to_ack.clear()
        self.joined.set()
        log.debug("group %r stream %r: joined as %s", rt.service, self.stream, member)
        await self._settle_joining()

    async def _settle_joining(self) -> None:
        """What a join leaves to do, retried (every few seconds) until done, and never
        in the way of reading: list the stream among the service's group streams
        (``streamjobs status`` finds it there), and make the members of joins whose
        reply was lost leave."""
        if time.monotonic() < self.settle_after:
            return
        rt = self.rt
        try:
            if not self.registered:
                async with rt.gateway._slot():
                    await rt.client.sadd(rt.gateway.keys.group_streams, self.stream)
                self.registered = True
            while self.orphans:
                orphan = self.orphans.pop()  # (the lane and the heartbeat loop both call)
                try:
                    await rt.gateway.scripts.group_leave(
                        keys=[self.stream, self.members], args=[rt.group, orphan]
                    )
                except BaseException:
                    self.orphans.append(orphan)
                    raise
        except Exception as exc:
            self.settle_after = time.monotonic() + _SETTLE_RETRY_S
            rt.metrics.loop_error(rt.service, "group")
            _log_failure(f"group stream {self.stream!r}: after joining", exc, _SETTLE_RETRY_S)

    async def _leave(self) -> None:
        members = [*self.orphans, *([self.member] if self.member else [])]
        if not members:
            return
        try:
            if not self.dead:
                await self._flush()
            for member in members:
                await self.rt.gateway.scripts.group_leave(
                    keys=[self.stream, self.members], args=[self.rt.group, member]
                )
        except Exception as exc:
            log.warning(
                "group %r stream %r: leaving failed (%s): its pending entries are "
                "reclaimed once its session expires",
                self.rt.service,
                self.stream,
                exc,
            )

    async def _pause(self, delay_s: float) -> bool:
        """Sleep ``delay_s``, ended early by a stop or a loss; False if it was."""
        with anyio.CancelScope() as scope:
            self._pause_scope = scope
            try:
                await anyio.sleep(delay_s)
            finally:
                self._pause_scope = None
        return not scope.cancelled_caught and not self.stopping and not self.dead

    async def _flush(self) -> None:
        if not self.to_ack or not self.usable():
            return
        ids = self.to_ack
        r = await self.rt.gateway.scripts.group_ack(
            keys=[self.stream, self.members, self.starts],
            args=[self.rt.group, self.member, *ids],
        )
        if int(r) < 0:
            self.lose("an acknowledgement was refused")
            return
        del ids[:]
        self.last_flush = time.perf_counter()

    async def _history(self) -> list[tuple[str, Any]]:
        """The entries pending under our own member (``XREADGROUP ... 0``), on the
        command channel, by the stream's slot."""
        rt = self.rt
        reply = await rt.gateway._command(
            self.stream,
            "XREADGROUP", "GROUP", rt.group, self.member, "COUNT", rt.config.read_batch_size,
            "STREAMS", self.stream, "0",
        )  # fmt: skip
        rt.gateway.last_ok = time.monotonic()
        return _read_entries(reply, rt.raw)

    async def _ack_and_read(self) -> tuple[list[tuple[str, Any]], str]:
        """One round trip per batch (standalone): the acknowledgement of the batch
        handled last (``group_ack.lua``), new entries (``XREADGROUP >``, not blocking)
        and the id of the stream's newest entry, in one MULTI. When nothing was new,
        the shared idle wait waits for an entry after that id, and none can have come
        in between.

        A MULTI runs every command it queued: if the acknowledgement is refused (the
        member is dead), the read still delivered entries to the dead member; they are
        dropped here and reclaimed by a live one."""
        rt = self.rt
        ids = self.to_ack if self.usable() else []
        commands: list[tuple[Any, ...]] = []
        if ids:
            commands.append(
                ("EVALSHA", rt.gateway.scripts.group_ack.sha, 3, self.stream, self.members,
                 self.starts, rt.group, self.member, *ids)
            )  # fmt: skip
        commands += [
            ("XREADGROUP", "GROUP", rt.group, self.member, "COUNT", rt.config.read_batch_size,
             "STREAMS", self.stream, ">"),
            ("XREVRANGE", self.stream, "+", "-", "COUNT", 1),
        ]  # fmt: skip
        replies = await rt.gateway._transaction(self.stream, commands)
        rt.gateway.last_ok = time.monotonic()
        if ids:
            acked = replies.pop(0)
            if isinstance(acked, NoScriptError):
                await self._flush()  # loads the script (a restarted or failed-over server)
            elif isinstance(acked, BaseException):
                raise translate(acked, in_script=True) from acked
            elif int(acked) < 0:
                self.lose("an acknowledgement was refused")
                return _NO_ENTRIES, "0-0"
            else:
                del ids[: len(ids)]
                self.last_flush = time.perf_counter()
        for reply in replies:
            if isinstance(reply, BaseException):
                raise translate(reply) from reply
        found = _stream_entries(replies[0])
        entries = (raw_sized_entries if rt.raw else sized_entries)(found)[0]
        tail = replies[1]
        newest = text(tail[0][0]) if tail else "0-0"
        return entries, newest

    async def _idle(self, newest: str) -> None:
        """Wait in the shared idle wait for an entry after ``newest``; a claim, a loss
        or a stop ends the wait at once."""
        waiter = self.rt.waiter
        # Nothing awaits between the check and the registration: a wake-up after the
        # future exists resolves it, and the wait returns at once.
        self._idle_wake = asyncio.get_running_loop().create_future()
        try:
            if self.stopping or self.dead or self.history:
                return
            block_s = self.rt.config.read_block_ms / 1000
            if not waiter.usable:
                # A cluster primary refused the keyspace flags: no event will come,
                # so the stream reads again every read_block_ms (no connection of its
                # own per idle stream: the pool stays bounded).
                await asyncio.wait({self._idle_wake}, timeout=block_s)
                return
            timeout_s = waiter.idle_timeout_s(self.stream, block_s)
            await waiter.wait(self.stream, newest, timeout_s, self._idle_wake)
        finally:
            self._idle_wake = None

    async def _step(self) -> None:
        if self.stopping or not self.usable():
            return
        if self.history:
            await self._flush()
            entries = await self._history()
            if not entries:
                self.history = False
                return
            redelivered = True
        else:
            entries, newest = await self._ack_and_read()
            if self.dead:
                return
            if not entries:
                await self._idle(newest)
                return
            redelivered = False
        with anyio.CancelScope() as scope:
            # Shutdown gives the call in flight shutdown_grace_s (Lane.stop sets the
            # deadline); then the rest of the batch stays pending, for another member.
            self._handle_scope = scope
            try:
                await self._handle_batch(entries, redelivered)
            finally:
                self._handle_scope = None

    async def _handle_batch(self, entries: list[tuple[str, Any]], redelivered: bool) -> None:
        """Hand ``entries`` to ``handle()`` in order, each queued for acknowledgement once
        done. ``redelivered``: they come from our own pending list (claimed from a
        member that died or stopped, or read again after a lost reply): each start of
        one is counted first, so an entry that keeps killing its consumers is
        dead-lettered (docs/shared-groups.md#crash-loops)."""
        rt = self.rt
        call = rt.caller()
        stream, to_ack = self.stream, self.to_ack
        clock = time.perf_counter
        durations: list[float] = []
        try:
            for entry_id, fields in entries:
                if self.stopping or self.dead or not self.usable():
                    return
                if fields is None:
                    # Pending, but trimmed or deleted from the stream: nothing to hand.
                    to_ack.append(entry_id)
                    continue
                restarts = 0
                if redelivered:
                    async with rt.gateway._slot():
                        restarts = int(await rt.client.hincrby(self.starts, entry_id, 1))
                    if restarts > rt.recovery.max_retries:
                        if not await self._crash_loop(entry_id, fields, restarts):
                            return
                        continue
                started = clock()
                try:
                    await call(Message(stream, entry_id, fields, _NO_INFO, 1))
                except Exception as exc:
                    if not await self._retry(call, entry_id, fields, restarts, exc, started):
                        return
                else:
                    now = clock()
                    durations.append(now - started)
                    to_ack.append(entry_id)
                    if now - self.last_flush > ACK_INTERVAL_S:
                        await self._flush()
        finally:
            if durations:
                rt.metrics.entries_handled(rt.service, EntryOutcome.OK, durations)

    async def _crash_loop(self, entry_id: str, fields: dict[Any, Any], restarts: int) -> bool:
        """Dead-letter an entry begun ``restarts`` times after its consumers died or
        stopped holding it; True once done (False: the lane stopped or lost its member)."""
        if not await self._dead_letter(
            entry_id,
            fields,
            0,
            f"begun {restarts} times after a consumer died or stopped holding it, never "
            "acknowledged: it may be killing its consumers",
            retry_count=restarts,
            reason=DeadLetterReason.MAX_RETRIES_EXCEEDED,
        ):
            return False
        self.to_ack.append(entry_id)
        await self._flush()
        return True

    async def _retry(
        self,
        call: Callable[[Message[Any]], Awaitable[None]],
        entry_id: str,
        fields: dict[Any, Any],
        restarts: int,
        first: Exception,
        started: float,
    ) -> bool:
        """Attempts 2.. of an entry whose first ``handle()`` call raised ``first``; True
        once it is done (handled or dead-lettered, and queued for acknowledgement),
        False if the lane stopped or lost its member meanwhile (it stays pending, for
        whoever holds it next)."""
        rt = self.rt
        attempt, error = 1, first
        while True:
            rt.metrics.handler_failed(rt.service)
            step = after_failure(
                error,
                attempt,
                max_attempts=rt.config.max_handler_attempts,
                backoff_s=rt.config.handler_backoff_s,
                backoff_max_s=rt.config.handler_backoff_max_s,
            )
            if isinstance(step, GiveUp):
                log.warning(
                    "group %r stream %r entry %s failed %d time(s) (%s): dead-lettering it",
                    rt.service,
                    self.stream,
                    entry_id,
                    attempt,
                    step.error,
                    extra=self.extra,
                )
                reason = (
                    DeadLetterReason.HANDLER_FAILED
                    if step.rejected is None
                    else DeadLetterReason.REJECTED
                )
                if not await self._dead_letter(
                    entry_id,
                    fields,
                    attempt,
                    step.error,
                    retry_count=restarts,
                    reason=reason,
                    rejected=step.rejected,
                ):
                    return False
                rt.metrics.entries_handled(
                    rt.service, EntryOutcome.DEAD_LETTERED, (time.perf_counter() - started,)
                )
                self.to_ack.append(entry_id)
                await self._flush()  # so that no other consumer handles it again
                return True
            if not await self._pause(step.delay_s) or not self.usable():
                return False
            attempt += 1
            try:
                await call(Message(self.stream, entry_id, fields, _NO_INFO, attempt))
            except Exception as exc:
                error = exc
                continue
            rt.metrics.entries_handled(
                rt.service, EntryOutcome.RETRIED, (time.perf_counter() - started,)
            )
            self.to_ack.append(entry_id)
            return True

    async def _dead_letter(
        self,
        entry_id: str,
        fields: Mapping[Any, Any],
        attempts: int,
        error: str,
        *,
        retry_count: int,
        reason: DeadLetterReason,
        rejected: str | None = None,
    ) -> bool:
        """Append the entry's dead letter (once: a second call for the same entry, by
        any member, finds the first one's marker); True once it is written, False if
        the lane stopped or lost its member first."""
        rt = self.rt
        letter = entry_dead_letter(
            {text(k): text(v) for k, v in fields.items()} if rt.raw else dict(fields),
            stream=self.stream,
            entry_id=entry_id,
            retry_count=retry_count,
            attempts=attempts,
            owner=self.member,
            error=error,
            rejected=rejected,
        )
        letter.append((GROUP_FIELD, rt.group))
        if reason is DeadLetterReason.MAX_RETRIES_EXCEEDED:
            letter = [(k, reason.value) if k == "_dlq_reason" else (k, v) for k, v in letter]
        backoff = Backoff()
        while True:
            if self.stopping or not self.usable():
                return False
            try:
                _, trimmed = await rt.gateway.dead_letter_entry(letter)
            except Exception as exc:
                rt.metrics.loop_error(rt.service, "group")
                delay = backoff.next_delay()
                _log_failure(f"group stream {self.stream!r}: writing a dead letter", exc, delay)
                if not await self._pause(delay):
                    return False
                continue
            rt.metrics.dead_lettered(rt.service, reason)
            if trimmed > 0:
                rt.metrics.dlq_trimmed(rt.service, trimmed)
            _tracing.mark(
                "streamjobs.dead_letter",
                {**self.extra, "entry_id": entry_id, "reason": reason.value},
            )
            return True


_NO_INFO: Mapping[str, Any] = {}


class GroupHooks(Protocol):
    """The user's side of a ``GroupConsumer``: ``handle`` (a coroutine function or a
    plain function: ``_pipeline.entry_caller``) and the two lifecycle hooks."""

    def handle(self, message: Message[Any]) -> Awaitable[None] | None: ...
    async def on_startup(self) -> None: ...
    async def on_shutdown(self) -> None: ...


class GroupRuntime:
    """Everything a running :class:`~streamjobs.GroupConsumer` holds."""

    def __init__(
        self,
        hooks: GroupHooks,
        gateway: Gateway,
        *,
        client: Any,
        name: str,
        streams: Sequence[str],
        start_id: str,
        config: ConsumerConfig,
        recovery: RecoveryConfig,
        metrics: MetricsRecorder,
        cluster: bool,
        retention: GroupRetention,
    ) -> None:
        self.hooks = hooks
        self.gateway = gateway
        self.client = client
        self.name = name
        self.service = gateway.keys.service
        self.group = gateway.keys.group
        self.streams = tuple(streams)
        self.start_id = start_id
        self.config = config
        self.recovery = recovery
        self.tally = Tally(metrics)
        self.metrics: MetricsRecorder = self.tally
        self.cluster = cluster
        self.retention = retention
        self.raw = gateway.raw_fields
        self.ttl_s = config.lock_ttl_s
        self.ttl_ms = max(1, int(config.lock_ttl_s * 1000))
        self.call_handle = entry_caller(hooks.handle)
        self.lanes: list[Lane] = []
        # The shared idle wait, as for StreamConsumer: one blocking read for every idle
        # stream (per 1,250 of them) on a standalone server; on a cluster, keyspace
        # events on one subscription per primary. Where that cannot serve (a primary
        # refusing the flags), idle streams read again every read_block_ms.
        self.waiter: Waiter | ClusterWaiter = idle_wait(
            client,
            gateway,
            cluster=cluster,
            block_ms=config.read_block_ms,
            streams=len(self.streams),
            metrics=metrics,
            service=self.service,
            configure_flags=recovery.configure_keyspace_events,
        )
        self.running = False
        self._stop = anyio.Event()
        self._ready = anyio.Event()
        self._stopped = anyio.Event()
        self._background = Background()

    def caller(self) -> Callable[[Message[Any]], Awaitable[None]]:
        """What calls ``handle()``: with its time limit and span, when configured."""
        call = self.call_handle
        timeout_s = self.config.handler_timeout_s
        if timeout_s is not None:
            call = functools.partial(_call_within, call, timeout_s)
        tracer = _tracing.tracer()
        if tracer is not None:
            call = functools.partial(
                _tracing.handle_in_span, tracer, call, group=self.group, consumer=self.name
            )
        return call

    def health(self) -> tuple[bool, str]:
        """Alive: running, and Redis answered within two session TTLs."""
        if not self.running:
            return False, "not running"
        last = self.gateway.last_ok
        if last is None or time.monotonic() - last > 2 * self.ttl_s:
            return False, "no reply from Redis within two session TTLs"
        return True, "ok"

    def readiness(self) -> tuple[bool, str]:
        """Ready: running, and a live member on every stream."""
        if not self.running or not self._ready.is_set():
            return False, "not started"
        missing = [lane.stream for lane in self.lanes if lane.dead]
        if missing:
            return False, f"no live member on {len(missing)} stream(s), e.g. {missing[0]!r}"
        return True, f"reading {len(self.lanes)} stream(s)"

    def statistics(self) -> ConsumerStatistics:
        return self.tally.statistics(
            service=self.service,
            consumer=self.name,
            running=self.running and self._ready.is_set(),
            healthy=self.health()[0],
            ready=self.readiness()[0],
            owned_streams=sum(1 for lane in self.lanes if not lane.dead),
            in_flight_handlers=sum(1 for lane in self.lanes if lane.handling),
            last_redis_ok=self.gateway.last_ok,
        )

    async def wait_ready(self) -> None:
        await self._ready.wait()

    async def aclose(self) -> None:
        self._stop.set()
        if self.running:
            await self._stopped.wait()

    async def enter(self, run: Callable[..., Awaitable[None]]) -> None:
        """``async with consumer``: start ``run`` in the background."""
        await self._background.start(run)

    async def exit(self) -> None:
        self._stop.set()
        await self._background.wait()

    async def _hook(self, name: str) -> None:
        try:
            await getattr(self.hooks, name)()
        except Exception as exc:
            raise HookFailed(name, exc) from exc

    async def run(self, task_status: anyio.abc.TaskStatus[None]) -> None:
        if self.running:
            raise StreamJobsError("this consumer is already running")
        self.running = True
        self._stopped = anyio.Event()
        # As StreamConsumer's: commands of all lanes share one connection per node (the
        # command channel), and what goes outside it holds one of redis_concurrency
        # slots, so the connections grow with the nodes, not with the streams.
        self.gateway.limiter = anyio.CapacityLimiter(self.config.redis_concurrency)
        self.gateway.scripts.channel = Channel(self.gateway.client)
        try:
            try:
                await self.gateway.load_scripts()
            except Exception as exc:
                error = translate(exc)
                if isinstance(error, RedisUnavailable):
                    raise error from exc
                raise
            await self._hook("on_startup")
            self.lanes = [Lane(self, stream) for stream in self.streams]
            async with anyio.create_task_group() as loops:
                await loops.start(self.waiter.run)
                async with anyio.create_task_group() as lanes:
                    for lane in self.lanes:
                        lanes.start_soon(lane.run)
                    loops.start_soon(self._beat_loop)
                    loops.start_soon(self._reclaim_loop)
                    if self.retention.active:
                        loops.start_soon(self._trim_loop)
                    with anyio.move_on_after(self.ttl_s):
                        for lane in self.lanes:
                            await lane.joined.wait()
                    self._ready.set()
                    task_status.started()
                    await self._stop.wait()
                    for lane in self.lanes:
                        lane.stop(self.config.shutdown_grace_s)
                loops.cancel_scope.cancel()
        finally:
            raising = sys.exc_info()[0] is not None
            with anyio.CancelScope(shield=True):
                try:
                    await self._hook("on_shutdown")
                except HookFailed as exc:
                    if not raising:
                        raise
                    log.error("%s (while run() ended with another error)", exc)
                finally:
                    self.running = False
                    self._stop = anyio.Event()
                    self._ready = anyio.Event()
                    self._stopped.set()

    # -- the shared loops --------------------------------------------------------------

    def _alive_lanes(self) -> list[Lane]:
        return [lane for lane in self.lanes if not lane.dead and not lane.stopping]

    async def _beat_loop(self) -> None:
        """Renew every live member each ``heartbeat_s``; a round that fails is logged,
        counted and tried again at the next interval (a member not renewed within a
        TTL stops handing entries by itself: ``Lane.usable``)."""
        while True:
            await anyio.sleep(self.config.heartbeat_s)
            try:
                await self._beat()
                self.gateway.last_ok = time.monotonic()
                self.metrics.heartbeat(self.service, True)
            except Exception as exc:
                self.metrics.heartbeat(self.service, False)
                self.metrics.loop_error(self.service, "group_heartbeat")
                _log_failure(f"group {self.service!r} heartbeat", exc, 0)
            for lane in self._alive_lanes():  # (an idle lane's own task is waiting)
                if not lane.registered or lane.orphans:
                    await lane._settle_joining()  # (logs its own failure)

    async def _beat(self) -> None:
        lanes = self._alive_lanes()
        if not lanes:
            return
        batches = [[lane] for lane in lanes] if self.cluster else [lanes]
        for batch in batches:
            sent = time.monotonic()
            members = [lane.member for lane in batch]
            replies = await self.gateway.scripts.group_beat(
                keys=[lane.members for lane in batch], args=[self.ttl_ms, *members]
            )
            for lane, member, ok in zip(batch, members, replies, strict=True):
                if lane.dead or lane.member != member:
                    continue  # (joined again meanwhile: the reply is about the old one)
                if int(ok) == 1:
                    lane.alive_until = sent + self.ttl_s
                else:
                    lane.lose("its session expired", member)

    async def _trim_loop(self) -> None:
        """Trim each stream below what every group acknowledged, and to the caps
        (``GroupRetention``; ``group_trim.lua``). Every consumer of the service tries,
        and the first one in an interval does it: the others find its pace key
        (``Keys.trimmed``, three quarters of the interval) and skip the pass."""
        r = self.retention
        args = [
            "1" if r.trim_acknowledged else "0",
            r.max_len or 0,
            0 if r.max_age_s is None else int(r.max_age_s * 1000),
            r.batch,
            max(1, int(r.interval_s * 750)),
        ]
        while True:
            await anyio.sleep(r.interval_s * random.uniform(0.75, 1.25))
            for lane in list(self.lanes):
                try:
                    await self._trim(lane, args)
                except Exception as exc:
                    self.metrics.loop_error(self.service, "group_trim")
                    _log_failure(f"group stream {lane.stream!r}: trimming", exc, 0)

    async def _trim(self, lane: Lane, args: Sequence[Any]) -> None:
        reply = await self.gateway.scripts.group_trim(
            keys=[lane.stream, self.gateway.keys.trimmed(lane.stream)], args=args
        )
        acknowledged, dropped = int(reply[0]), int(reply[1])
        if acknowledged or dropped:
            self.metrics.stream_trimmed(self.service, acknowledged, dropped)
        if dropped:
            log.warning(
                "group %r stream %r: a retention cap trimmed %d entries at or above "
                "the oldest one some group has not acknowledged",
                self.service,
                lane.stream,
                dropped,
                extra=lane.extra,
            )

    async def _reclaim_loop(self) -> None:
        """A reclaim pass over every live lane about every ``RECLAIM_INTERVAL_S``. A
        failure (a Redis error, an odd reply) is logged and counted, and the pass goes
        on with the next lane."""
        while True:
            await anyio.sleep(RECLAIM_INTERVAL_S * random.uniform(0.75, 1.25))
            for lane in self._alive_lanes():
                try:
                    await self._reclaim(lane)
                except Exception as exc:
                    self.metrics.loop_error(self.service, "group_reclaim")
                    _log_failure(f"group stream {lane.stream!r}: reclaim", exc, 0)
                    # The pass may have claimed entries for this member before its
                    # reply was lost: nobody else would take them from a live member,
                    # so the lane reads its own pending list next.
                    lane.claimed(1)

    async def _reclaim(self, lane: Lane) -> None:
        """``group_reclaim.lua`` on one lane's stream: claim what dead or stopped
        members (and, after ``min_idle_s``, names without a session) hold."""
        member = lane.member
        r = await self.gateway.scripts.group_reclaim(
            keys=[lane.stream, lane.members],
            args=[
                self.group,
                member,
                self.config.read_batch_size,
                int(self.recovery.min_idle_s * 1000),
                int(FORGET_AFTER_S * 1000),
            ],
        )
        self.tally.reclaim_pass()
        code = int(r[0])
        if code == -1:
            lane.lose("its session expired (seen by the reclaim pass)", member)
        elif code == 1 and r[1]:
            self.metrics.entries_reclaimed(self.service, len(r[1]))
            log.info(
                "group %r stream %r: claimed %d entries from dead members",
                self.service,
                lane.stream,
                len(r[1]),
                extra=lane.extra,
            )
            lane.claimed(len(r[1]))
