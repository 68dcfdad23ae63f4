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
import logging
import math
import random
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

import anyio
import anyio.abc

from ._backoff import Backoff
from ._cluster_waiter import ClusterWaiter, idle_wait
from ._deadletter import GROUP_FIELD, REASON_FIELD, DeadLetterReason, Pairs, entry_dead_letter
from ._guard import log_failure
from ._lifecycle import Lifecycle
from ._pipeline import Admit, EntryPipeline
from ._redis import Channel, Gateway, text_fields, translate
from ._stats import ConsumerStatistics, Tally
from ._waiter import Waiter
from .config import ConsumerConfig, GroupRetention, RecoveryConfig
from .exceptions import NoSuchGroup, RedisUnavailable
from .message import Message
from .metrics import MetricsRecorder, StreamEvent

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
_NO_INFO: Mapping[str, Any] = {}


def _log_failure(what: str, exc: BaseException, delay_s: float) -> None:
    """``log_failure`` of what the client raised, as the gateway boundary translates it
    (a lost connection is one line, not a traceback)."""
    log_failure(log, what, translate(exc), delay_s)


class Lane:
    """One stream of a group consumer (see the module docstring), and its seat in the
    entry pipeline (``_pipeline.Seat``): it hands entries while its member is alive,
    and acknowledges them at least every ``ACK_INTERVAL_S``."""

    loop = "group"
    ack_interval_s: float | None = ACK_INTERVAL_S
    info: Mapping[str, Any] = _NO_INFO

    def __init__(self, runtime: GroupRuntime, stream: str) -> None:
        self.rt = runtime
        self.stream = stream
        self.groups = runtime.gateway.groups
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
        self.log = logging.LoggerAdapter(log, self.extra)
        self.restarts = 0
        """Starts counted for the redelivered entry being handled (its dead letter's
        ``_retry_count``)."""

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
                    if isinstance(translate(exc), NoSuchGroup):
                        self.dead = True  # the stream or its group was deleted: join again
                    await self.pause(delay)
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                await self._leave()

    async def _join(self) -> None:
        rt = self.rt
        member = f"{rt.name}~{secrets.token_hex(4)}"
        sent = time.monotonic()
        try:
            await self.groups.join(self.stream, member, rt.ttl_ms, rt.start_id)
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
                await self.groups.register(self.stream)
                self.registered = True
            while self.orphans:
                orphan = self.orphans.pop()  # (the lane and the heartbeat loop both call)
                try:
                    await self.groups.leave(self.stream, orphan)
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
                await self.flush()
            for member in members:
                await self.groups.leave(self.stream, member)
        except Exception as exc:
            log.warning(
                "group %r stream %r: leaving failed (%s): its pending entries are "
                "reclaimed once its session expires",
                self.rt.service,
                self.stream,
                exc,
            )

    async def pause(self, delay_s: float) -> bool:
        """Sleep ``delay_s``, ended early by a stop or a loss; False if it was."""
        with anyio.CancelScope() as scope:
            self._pause_scope = scope
            try:
                await anyio.sleep(delay_s)
            finally:
                self._pause_scope = None
        return not scope.cancelled_caught and not self.stopping and not self.dead

    async def flush(self) -> None:
        if not self.to_ack or not self.usable():
            return
        ids = self.to_ack
        sent = len(ids)
        if not await self.groups.ack(self.stream, self.member, ids[:sent]):
            self.lose("an acknowledgement was refused")
            return
        del ids[:sent]
        self.last_flush = time.perf_counter()

    async def _ack_and_read(self) -> tuple[list[tuple[str, Any]], str]:
        """The acknowledgement of the batch handled last, and the next batch, in one
        round trip (``GroupCommands.ack_and_read``)."""
        ids = self.to_ack if self.usable() else []
        sent = len(ids)
        read = await self.groups.ack_and_read(
            self.stream, self.member, ids[:sent], self.rt.config.read_batch_size
        )
        if read.refused:
            self.lose("an acknowledgement was refused")
            return _NO_ENTRIES, "0-0"
        if sent:
            del ids[:sent]
            self.last_flush = time.perf_counter()
        return read.entries, read.newest

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
            await self.flush()
            entries = await self.groups.history(
                self.stream, self.member, self.rt.config.read_batch_size
            )
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
        """Hand ``entries`` to the entry pipeline. ``redelivered``: they come from our
        own pending list (claimed from a member that died or stopped, or read again
        after a lost reply): each start of one is counted first, so an entry that keeps
        killing its consumers is dead-lettered (docs/shared-groups.md#crash-loops)."""
        self.restarts = 0
        if not redelivered:
            await self.rt.pipeline.handle_batch(self, entries)
            return
        live = []
        for entry_id, fields in entries:
            if fields is None:
                # Pending, but trimmed or deleted from the stream: nothing to hand.
                self.to_ack.append(entry_id)
            else:
                live.append((entry_id, fields))
        await self.rt.pipeline.handle_batch(self, live, self._count_start)

    async def _count_start(self, entry_id: str, fields: Mapping[Any, Any]) -> Admit:
        """Count one more start of a redelivered entry; past ``max_retries`` starts it
        is dead-lettered instead of handed (``Admit.SKIP``)."""
        rt = self.rt
        self.restarts = await self.groups.count_start(self.stream, entry_id)
        if self.restarts <= rt.recovery.max_retries:
            return Admit.HAND
        reason = DeadLetterReason.MAX_RETRIES_EXCEEDED
        letter = [
            (k, reason.value) if k == REASON_FIELD else (k, v)
            for k, v in self.dead_letter(
                entry_id,
                text_fields(fields),
                0,
                f"begun {self.restarts} times after a consumer died or stopped holding it, "
                "never acknowledged: it may be killing its consumers",
                None,
            )
        ]
        if not await rt.pipeline.dead_letter(self, entry_id, letter, reason, fields):
            return Admit.STOP
        self.to_ack.append(entry_id)
        await self.flush()
        return Admit.SKIP

    # -- its seat in the entry pipeline (_pipeline.Seat) ------------------------------

    def clear(self, now: float) -> bool:
        return not (self.stopping or self.dead) and now < self.alive_until

    async def may_hand(self) -> bool:
        return not self.stopping and self.usable()

    async def may_retry(self) -> bool:
        return not self.stopping and self.usable()

    def holds(self) -> bool:
        return not self.stopping and self.usable()

    def log_extra(self) -> dict[str, str]:
        return self.extra

    def dead_letter(
        self,
        entry_id: str,
        fields: dict[str, str],
        attempts: int,
        error: str,
        rejected: str | None,
    ) -> Pairs:
        letter = entry_dead_letter(
            fields,
            stream=self.stream,
            entry_id=entry_id,
            retry_count=self.restarts,
            attempts=attempts,
            owner=self.member,
            error=error,
            rejected=rejected,
        )
        letter.append((GROUP_FIELD, self.rt.group))
        return letter


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
        self.pipeline = EntryPipeline(
            hooks.handle,
            config=config,
            metrics=self.metrics,
            service=self.service,
            consumer=name,
            group=self.group,
            dead_letters=gateway,
        )
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
        self.life = Lifecycle(hooks)

    def health(self) -> tuple[bool, str]:
        """Alive: running, and Redis answered within two session TTLs."""
        if not self.life.active:
            return False, "not running"
        last = self.gateway.last_ok
        if last is None or time.monotonic() - last > 2 * self.ttl_s:
            return False, "no reply from Redis within two session TTLs"
        return True, "ok"

    def readiness(self) -> tuple[bool, str]:
        """Ready: running, and a live member on every stream."""
        if not self.life.started:
            return False, "not started"
        missing = [lane.stream for lane in self.lanes if lane.dead]
        if missing:
            return False, f"no live member on {len(missing)} stream(s), e.g. {missing[0]!r}"
        return True, f"reading {len(self.lanes)} stream(s)"

    def statistics(self) -> ConsumerStatistics:
        return self.tally.statistics(
            service=self.service,
            consumer=self.name,
            running=self.life.started,
            healthy=self.health()[0],
            ready=self.readiness()[0],
            owned_streams=sum(1 for lane in self.lanes if not lane.dead),
            in_flight_handlers=sum(1 for lane in self.lanes if lane.handling),
            last_redis_ok=self.gateway.last_ok,
        )

    async def wait_ready(self) -> None:
        await self.life.wait_ready()

    async def aclose(self) -> None:
        await self.life.aclose()

    async def enter(self, run: Callable[..., Awaitable[None]]) -> None:
        await self.life.enter(run)

    async def exit(self) -> None:
        await self.life.exit()

    async def run(self, task_status: anyio.abc.TaskStatus[None]) -> None:
        async with self.life.running():
            # As StreamConsumer's: commands of all lanes share one connection per node
            # (the command channel), and what goes outside it holds one of
            # redis_concurrency slots, so connections grow with nodes, not streams.
            self.gateway.limiter = anyio.CapacityLimiter(self.config.redis_concurrency)
            self.gateway.scripts.channel = Channel(self.gateway.client)
            try:
                await self.gateway.load_scripts()
            except Exception as exc:
                error = translate(exc)
                if isinstance(error, RedisUnavailable):
                    raise error from exc
                raise
            await self.life.hook("on_startup")
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
                    self.life.ready.set()
                    task_status.started()
                    await self.life.stop.wait()
                    for lane in self.lanes:
                        lane.stop(self.config.shutdown_grace_s)
                loops.cancel_scope.cancel()

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
            replies = await self.gateway.groups.beat(
                [lane.stream for lane in batch], members, self.ttl_ms
            )
            for lane, member, ok in zip(batch, members, replies, strict=True):
                if lane.dead or lane.member != member:
                    continue  # (joined again meanwhile: the reply is about the old one)
                if ok:
                    lane.alive_until = sent + self.ttl_s
                else:
                    lane.lose("its session expired", member)

    async def _trim_loop(self) -> None:
        """Trim each stream below what every group acknowledged, and to the caps
        (``GroupRetention``; ``group_trim.lua``). Every consumer of the service tries,
        and the first one in an interval does it: the others find its pace key
        (``Keys.trimmed``, three quarters of the interval) and skip the pass."""
        r = self.retention
        max_age_ms = 0 if r.max_age_s is None else int(r.max_age_s * 1000)
        pace_ms = max(1, int(r.interval_s * 750))
        while True:
            await anyio.sleep(r.interval_s * random.uniform(0.75, 1.25))
            for lane in list(self.lanes):
                try:
                    await self._trim(lane, max_age_ms, pace_ms)
                except Exception as exc:
                    self.metrics.loop_error(self.service, "group_trim")
                    _log_failure(f"group stream {lane.stream!r}: trimming", exc, 0)

    async def _trim(self, lane: Lane, max_age_ms: int, pace_ms: int) -> None:
        r = self.retention
        acknowledged, dropped = await self.gateway.groups.trim(
            lane.stream,
            acknowledged=r.trim_acknowledged,
            max_len=r.max_len or 0,
            max_age_ms=max_age_ms,
            batch=r.batch,
            pace_ms=pace_ms,
        )
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
        reclaimed = await self.gateway.groups.reclaim(
            lane.stream,
            member,
            self.config.read_batch_size,
            int(self.recovery.min_idle_s * 1000),
            int(FORGET_AFTER_S * 1000),
        )
        self.tally.reclaim_pass()
        if not reclaimed.alive:
            lane.lose("its session expired (seen by the reclaim pass)", member)
        elif reclaimed.ids:
            self.metrics.entries_reclaimed(self.service, len(reclaimed.ids))
            log.info(
                "group %r stream %r: claimed %d entries from dead members",
                self.service,
                lane.stream,
                len(reclaimed.ids),
                extra=lane.extra,
            )
            lane.claimed(len(reclaimed.ids))
