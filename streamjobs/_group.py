"""The runtime of a :class:`~streamjobs.GroupConsumer`: many consumers on one stream
(docs/shared-groups.md).

One *lane* per stream the consumer reads (``_group_lane``), and the loops that serve
every lane: the heartbeat renews each member's deadline (``group_beat.lua``, which
never revives a dead member), the reclaim pass (``group_reclaim.lua``) claims the
entries pending under dead or stopped members, and under names with no session after
``min_idle_s``, and trimming keeps each stream below what every group acknowledged.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence

import anyio
import anyio.abc

from ._cluster_waiter import ClusterWaiter, idle_wait
from ._group_lane import Lane, log, log_group_failure
from ._kind_runtime import KindRuntime, Parts
from ._redis._boundary import translate
from ._redis._channel import Channel
from ._redis._gateway import Gateway
from ._redis._protocol import GroupGateway
from ._waiter import Waiter
from .config import GroupRetention
from .exceptions import RedisUnavailable

RECLAIM_INTERVAL_S = 0.5
"""Mean pause between two reclaim passes of a consumer (jittered by a quarter either
way): a dead member's entries are claimed within its session TTL plus this, plus a pass."""

FORGET_AFTER_S = 3600.0
"""How long a dead or stopped member with nothing pending stays in the member index
(``streamjobs status`` shows it), before it leaves the index and the group."""


class GroupRuntime(KindRuntime):
    """Everything a running :class:`~streamjobs.GroupConsumer` holds."""

    def __init__(
        self,
        parts: Parts,
        *,
        streams: Sequence[str],
        start_id: str,
        cluster: bool,
        retention: GroupRetention,
    ) -> None:
        super().__init__(parts)
        gateway: GroupGateway = parts.gateway
        client, config, recovery = parts.client, parts.config, parts.recovery
        self.gateway: GroupGateway = gateway
        self.group = gateway.keys.group
        self.streams = tuple(streams)
        self.start_id = start_id
        self.cluster = cluster
        self.retention = retention
        self.raw = gateway.raw_fields
        self.ttl_s = config.lock_ttl_s
        self.ttl_ms = max(1, int(config.lock_ttl_s * 1000))
        self.lanes: list[Lane] = []
        # The shared idle wait, as for StreamConsumer: one blocking read for every idle
        # stream (per 1,250 of them) on a standalone server; on a cluster, keyspace
        # events on one subscription per primary. Where that cannot serve (a primary
        # refusing the flags), idle streams read again every read_block_ms.
        self.waiter: Waiter | ClusterWaiter | None = None
        if isinstance(gateway, Gateway):  # (the in-memory fake has no client to wait on)
            self.waiter = idle_wait(
                client,
                gateway,
                cluster=cluster,
                block_ms=config.read_block_ms,
                streams=len(self.streams),
                metrics=self.metrics,
                service=self.service,
                configure_flags=recovery.configure_keyspace_events,
            )

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

    def held(self) -> tuple[int, int]:
        lanes = self.lanes
        return sum(1 for lane in lanes if not lane.dead), sum(1 for lane in lanes if lane.handling)

    async def run(self, task_status: anyio.abc.TaskStatus[None]) -> None:
        async with self.life.running():
            # As StreamConsumer's: commands of all lanes share one connection per node
            # (the command channel), and what goes outside it holds one of
            # redis_concurrency slots, so connections grow with nodes, not streams.
            gateway = self.gateway
            if isinstance(gateway, Gateway):
                gateway.limiter = anyio.CapacityLimiter(self.config.redis_concurrency)
                gateway.scripts.channel = Channel(gateway.client)
            try:
                await self.gateway.assignments.load_scripts()
            except Exception as exc:
                error = translate(exc)
                if isinstance(error, RedisUnavailable):
                    raise error from exc
                raise
            await self.life.hook("on_startup")
            self.lanes = [Lane(self, stream) for stream in self.streams]
            async with anyio.create_task_group() as loops:
                if self.waiter is not None:
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
                log_group_failure(f"group {self.service!r} heartbeat", exc, 0)
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
                    log_group_failure(f"group stream {lane.stream!r}: trimming", exc, 0)

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
                    log_group_failure(f"group stream {lane.stream!r}: reclaim", exc, 0)
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
