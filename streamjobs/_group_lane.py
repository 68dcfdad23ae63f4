"""One stream of a :class:`~streamjobs.GroupConsumer` (docs/shared-groups.md): a *lane*.

A lane joins the service's consumer group on its stream as a *member*: the consumer's
name and a fresh incarnation, with a session deadline in the stream's member index
(``Keys.members``), in the stream's slot. It reads (``XREADGROUP >``), hands each entry
to the entry pipeline (``_pipeline``: retries, timeout, dead letters) in the order
read, and acknowledges through ``group_ack.lua``, which refuses a member whose session
is over. A lane that learns its member is dead drops what it holds and joins again
under a new incarnation: what the old one held is reclaimed, by it or by another member.
The consumer's loops (heartbeat, reclaim, trimming) are its host's (``_group``).
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
import time
from collections.abc import Mapping
from typing import Any, Protocol

import anyio

from ._backoff import Backoff
from ._deadletter import GROUP_FIELD, REASON_FIELD, Pairs, entry_dead_letter
from ._dlq_reason import DeadLetterReason
from ._guard import log_failure
from ._idle import IdleWait
from ._pipeline import Admit, EntryPipeline, Failed, GiveUp
from ._redis._boundary import translate
from ._redis._protocol import GroupGateway
from ._redis._replies import text_fields
from .config import ConsumerConfig, RecoveryConfig
from .exceptions import NoSuchGroup
from .metrics import MetricsRecorder, StreamEvent

log = logging.getLogger("streamjobs.group")

ACK_INTERVAL_S = 1.0
"""Longest a handled entry waits for its acknowledgement while its batch goes on."""

_SETTLE_RETRY_S = 5.0
"""Pause before what a join left to do is tried again, after a failure."""

_NO_ENTRIES: list[tuple[str, Any]] = []
_NO_INFO: Mapping[str, Any] = {}


def log_group_failure(what: str, exc: BaseException, delay_s: float) -> None:
    """``log_failure`` of what the client raised, as the gateway boundary translates it
    (a lost connection is one line, not a traceback)."""
    log_failure(log, what, translate(exc), delay_s)


class LaneHost(Protocol):
    """The group consumer's runtime, as one of its lanes sees it."""

    gateway: GroupGateway
    metrics: MetricsRecorder
    pipeline: EntryPipeline
    config: ConsumerConfig
    recovery: RecoveryConfig

    @property
    def waiter(self) -> IdleWait | None: ...

    service: str
    group: str
    name: str
    start_id: str
    ttl_s: float
    ttl_ms: int


class Lane:
    """One stream of a group consumer (see the module docstring), and its seat in the
    entry pipeline (``_pipeline.Seat``): it hands entries while its member is alive,
    and acknowledges them at least every ``ACK_INTERVAL_S``."""

    loop = "group"
    ack_interval_s: float | None = ACK_INTERVAL_S
    info: Mapping[str, Any] = _NO_INFO

    def __init__(self, host: LaneHost, stream: str) -> None:
        self.host = host
        self.stream = stream
        self.groups = host.gateway.groups
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
        self.extra = {"stream": stream, "service": host.service}
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
        self.host.metrics.stream_event(self.host.service, StreamEvent.LOST)
        log.warning(
            "group %r stream %r: member %s is dead (%s); joining again",
            self.host.service,
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
                    self.host.metrics.loop_error(self.host.service, "group")
                    delay = backoff.next_delay()
                    log_group_failure(f"group stream {self.stream!r}", exc, delay)
                    # A read may have delivered entries whose reply was lost.
                    self.history = True
                    if isinstance(translate(exc), NoSuchGroup):
                        self.dead = True  # the stream or its group was deleted: join again
                    await self.pause(delay)
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                await self._leave()

    async def _join(self) -> None:
        rt = self.host
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
        rt = self.host
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
            log_group_failure(f"group stream {self.stream!r}: after joining", exc, _SETTLE_RETRY_S)

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
                self.host.service,
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
            self.stream, self.member, ids[:sent], self.host.config.read_batch_size
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
        waiter = self.host.waiter
        # Nothing awaits between the check and the registration: a wake-up after the
        # future exists resolves it, and the wait returns at once.
        self._idle_wake = asyncio.get_running_loop().create_future()
        try:
            if self.stopping or self.dead or self.history:
                return
            block_s = self.host.config.read_block_ms / 1000
            if waiter is None or not waiter.usable:
                # No shared idle wait (a cluster primary refused the keyspace flags, or
                # an in-memory gateway): the stream reads again every read_block_ms (no
                # connection of its own per idle stream: the pool stays bounded).
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
                self.stream, self.member, self.host.config.read_batch_size
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
            await self.host.pipeline.handle_batch(self, entries)
            return
        live = []
        for entry_id, fields in entries:
            if fields is None:
                # Pending, but trimmed or deleted from the stream: nothing to hand.
                self.to_ack.append(entry_id)
            else:
                live.append((entry_id, fields))
        await self.host.pipeline.handle_batch(self, live, self._count_start)

    async def _count_start(self, entry_id: str, fields: Mapping[Any, Any]) -> Admit:
        """Count one more start of a redelivered entry; past ``max_retries`` starts it
        is dead-lettered instead of handed (``Admit.SKIP``)."""
        rt = self.host
        self.restarts = await self.groups.count_start(self.stream, entry_id)
        if self.restarts <= rt.recovery.max_retries:
            return Admit.HAND
        reason = DeadLetterReason.MAX_RETRIES_EXCEEDED
        letter = [
            (k, reason.value) if k == REASON_FIELD else (k, v)
            for k, v in self.dead_letter(
                entry_id,
                text_fields(fields),
                Failed(
                    0,
                    GiveUp(
                        f"begun {self.restarts} times after a consumer died or stopped "
                        "holding it, never acknowledged: it may be killing its consumers"
                    ),
                ),
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

    def dead_letter(self, entry_id: str, fields: dict[str, str], failed: Failed) -> Pairs:
        letter = entry_dead_letter(
            fields,
            stream=self.stream,
            entry_id=entry_id,
            retry_count=self.restarts,
            attempts=failed.attempts,
            owner=self.member,
            error=failed.step.error,
            rejected=failed.step.rejected,
        )
        letter.append((GROUP_FIELD, self.host.group))
        return letter
