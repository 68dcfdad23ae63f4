"""Idle waiting on an OSS cluster: keyspace events of stream writes, one subscription
per primary (docs/design.md#idle-waiting-on-a-cluster).

Keys of many slots cannot share a blocking read on a cluster, so instead of one
``XREAD BLOCK`` connection per idle stream, a stream that has nothing to read
subscribes to its key's keyspace channel (``__keyspace@0__:<stream>``) on the
subscription of the primary that holds its slot, and is woken by the next event on
it (an ``XADD``, a trim, a deletion by expiry). Subscribing closes no gap by itself: an
entry appended between the fenced read that found nothing and the subscription's
confirmation publishes before anyone listens. So once the server confirms a
subscription, one check (``Gateway.newer_than``: does the stream still exist, and
has it an entry after the last one seen?) wakes the stream if it missed something.

Connections grow with primaries, not with idle streams: one pub/sub connection per
primary. The cost is on the server: with the ``t`` and ``g`` classes of
``notify-keyspace-events`` set, every stream command and every ``DEL``, ``EXPIRE`` or
``RENAME`` on the cluster publishes an event, listened to or not.

Correctness never depends on this: a waiting stream reads again by itself after
``IDLE_RECHECK_S`` (its safety net), after ``read_block_ms`` while its primary's
subscription is down, and a consumer whose flags cannot be set (a managed server
refusing ``CONFIG SET``) waits with a blocking read per stream as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from typing import Any

import anyio
import anyio.abc

from ._guard import LoopGuard
from ._notifications import cause, ensure_keyspace_events, node_client
from ._redis._boundary import Addr, translate
from ._redis._gateway import Gateway
from ._redis._protocol import StreamGateway
from ._redis._replies import text
from ._waiter import IDLE_RECHECK_S, Wait, Waiter, register, until_woken
from .exceptions import RedisUnavailable
from .metrics import MetricsRecorder

log = logging.getLogger(__name__)

FLAGS = "Kgt"
"""Keyspace channels (``K``) of stream commands (``t``) and of generic ones (``g``:
``del``, ``rename``, so that a stream deleted or replaced while idle is woken);
expiries (``x``) come from the recovery's own flags."""

WAKE_EVENTS = frozenset(
    {"xadd", "xtrim", "xdel", "xsetid", "xgroup-destroy", "del", "expired", "evicted",
     "rename_from"}
)  # fmt: skip
"""Events that wake a waiting stream. Not the group's own bookkeeping
(``xgroup-createconsumer``: a fenced read of the idle stream itself makes one)."""

REMAP_S = 5.0
"""How often subscriptions are checked against the client's slot table: a stream
whose slot moved (a failover, a resharding) subscribes on its new primary."""

_DEBOUNCE_S = 0.002
"""Registrations arriving together are subscribed with one command."""

_CHANNEL = "__keyspace@0__:"


class _Node:
    """The subscription on one primary, and the channels it should hold."""

    def __init__(self, owner: ClusterWaiter, name: str, addr: Addr) -> None:
        self.owner = owner
        self.name = name
        self.addr = addr
        self.streams: set[str] = set()
        """Streams whose channel this node should be subscribed to."""
        self.subscribed: set[str] = set()
        self.up = False
        self._changed = anyio.Event()

    def changed(self) -> None:
        self._changed.set()

    async def run(self) -> None:
        owner = self.owner
        guard = LoopGuard("waiter", owner.service, owner.metrics, log)
        try:
            while True:
                try:
                    await self._serve()
                except Exception as raised:
                    # A dropped subscription (its primary killed or failed over) comes
                    # wrapped by the task group, from redis-py: a Redis failure like any
                    # other, logged in one line.
                    exc = translate(cause(raised))
                    self.up = False
                    for stream in list(self.streams):  # they read by themselves meanwhile
                        owner.wake(stream)
                    if not self.streams:  # nobody waits here (a primary gone): stop
                        return
                    await guard.failed(exc, f"keyspace events on {self.addr[0]}:{self.addr[1]}")
        finally:
            if owner.nodes.get(self.name) is self:
                del owner.nodes[self.name]

    async def _serve(self) -> None:
        client = node_client(self.owner.client, self.addr)
        pubsub = client.pubsub()
        try:
            if not await ensure_keyspace_events(
                client, FLAGS, configure=self.owner.configure_flags
            ):
                self.owner.flags_refused = True
                raise RedisUnavailable(f"notify-keyspace-events lacks {FLAGS!r}")
            self.subscribed = set()
            # A channel of our own, so that the connection is up and confirmed
            # before any stream needs it.
            await pubsub.subscribe(f"streamjobs:waiter:{self.owner.service}")
            self._changed.set()  # (re)subscribe every stream that waits here
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._apply, pubsub)
                await self._listen(pubsub, tg)
        finally:
            self.up = False
            with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
                await pubsub.aclose()  # type: ignore[no-untyped-call]
            with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
                await client.aclose()

    async def _listen(self, pubsub: Any, tg: anyio.abc.TaskGroup) -> None:
        owner = self.owner
        while True:
            msg = await pubsub.get_message(ignore_subscribe_messages=False, timeout=30.0)
            if msg is None:
                continue
            kind = text(msg.get("type", b""))
            channel = text(msg.get("channel", b""))
            if not channel.startswith(_CHANNEL):
                if kind == "subscribe":
                    self.up = True
                continue
            stream = channel[len(_CHANNEL) :]
            if kind == "message":
                if text(msg.get("data", b"")) in WAKE_EVENTS:
                    owner.metrics.notification(owner.service, "stream_write")
                    owner.wake(stream)
            elif kind == "subscribe":
                tg.start_soon(owner.check_gap, stream)

    async def _apply(self, pubsub: Any) -> None:
        while True:
            await self._changed.wait()
            self._changed = anyio.Event()
            await anyio.sleep(_DEBOUNCE_S)
            add = self.streams - self.subscribed
            drop = self.subscribed - self.streams
            if add:
                self.subscribed |= add
                await pubsub.subscribe(*[_CHANNEL + s for s in add])
            if drop:
                self.subscribed -= drop
                await pubsub.unsubscribe(*[_CHANNEL + s for s in drop])


class ClusterWaiter:
    """The idle wait of one consumer on an OSS cluster (see the module docstring).

    Args:
        client: the user's ``RedisCluster``: its slot table routes each stream, its
            credentials open the per-primary subscriptions.
        gateway: for the check after a subscription.
        configure_flags: merge ``Kt`` into ``notify-keyspace-events`` on each primary
            (``RecoveryConfig.configure_keyspace_events``); when False the operator
            sets it.
    """

    def __init__(
        self,
        client: Any,
        gateway: Gateway,
        *,
        metrics: MetricsRecorder,
        service: str,
        configure_flags: bool = True,
    ) -> None:
        self.client = client
        self.gateway = gateway
        self.metrics = metrics
        self.service = service
        self.configure_flags = configure_flags
        self.flags_refused = False
        """A primary refused the flags: streams wait with blocking reads of their own."""
        self._waiting: dict[str, Wait] = {}
        self.nodes: dict[str, _Node] = {}
        """The subscription of each primary some stream waits on (by node name)."""
        self._tg: anyio.abc.TaskGroup | None = None

    @property
    def usable(self) -> bool:
        """Streams may wait here (else: a blocking read of their own)."""
        return self._tg is not None and not self.flags_refused

    def _node(self, stream: str) -> _Node:
        node = self.client.get_node_from_key(stream)
        found = self.nodes.get(node.name)
        if found is None:
            found = self.nodes[node.name] = _Node(self, node.name, (node.host, int(node.port)))
            assert self._tg is not None
            self._tg.start_soon(found.run)
        return found

    async def wait(
        self,
        stream: str,
        after_id: str,
        timeout_s: float,
        woken: asyncio.Future[None] | None = None,
    ) -> None:
        """Return once ``stream`` has (probably) an entry newer than ``after_id``, after
        ``timeout_s``, or once ``woken`` (the wait's own future) is resolved."""
        node = self._node(stream)
        if woken is None:
            woken = asyncio.get_running_loop().create_future()
        entry = Wait(after_id, woken, node.name)
        register(self._waiting, stream, entry)
        if stream in node.subscribed:
            # Still subscribed (a wake-up that found nothing new, re-waiting before the
            # unsubscription): no confirmation comes, so the gap is checked now.
            self._tg.start_soon(self.check_gap, stream)  # type: ignore[union-attr]
        node.streams.add(stream)
        node.changed()
        try:
            await until_woken(entry, timeout_s)
        finally:
            if self._waiting.get(stream) is entry:
                del self._waiting[stream]
                current = self.nodes.get(entry.node)
                if current is not None:
                    current.streams.discard(stream)
                    current.changed()

    def idle_timeout_s(self, stream: str, fallback_s: float) -> float:
        """How long ``stream`` may wait here before reading again by itself."""
        node = self.nodes.get(self.client.get_node_from_key(stream).name)
        if node is None or node.up:  # a new node's subscription is on its way
            return IDLE_RECHECK_S * random.uniform(0.5, 1.0)
        return fallback_s

    def wake(self, stream: str) -> None:
        """Wake ``stream``'s wait, if it waits (its stream was written to)."""
        entry = self._waiting.get(stream)
        if entry is not None:
            entry.wake()

    async def check_gap(self, stream: str) -> None:
        """Wake ``stream`` if it missed an entry (or vanished) before its subscription."""
        entry = self._waiting.get(stream)
        if entry is None:
            return
        try:
            missed = await self.gateway.streams.newer_than(stream, entry.after_id)
        except Exception:
            missed = True  # it reads by itself: that read tells
        if missed:
            entry.wake()

    async def run(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        async with anyio.create_task_group() as tg:
            self._tg = tg
            try:
                task_status.started()
                while True:
                    await anyio.sleep(REMAP_S)
                    self._remap()
            finally:
                self._tg = None

    def _remap(self) -> None:
        """Wake the streams whose slot now lives on another primary: each reads, then
        waits on its new primary's subscription."""
        for stream, entry in list(self._waiting.items()):
            try:
                name = self.client.get_node_from_key(stream).name
            except Exception:  # no slot table just now: the next round
                continue
            if name != entry.node:
                entry.wake()


def idle_wait(
    client: Any,
    gateway: StreamGateway,
    *,
    cluster: bool,
    block_ms: int,
    streams: int,
    metrics: MetricsRecorder,
    service: str,
    configure_flags: bool,
) -> Waiter | ClusterWaiter:
    """A consumer's shared idle wait (docs/design.md#idle-waiting-on-a-cluster): one
    blocking read per 1,250 of its ``streams`` on a standalone server, keyspace events
    on one subscription per primary on a cluster."""
    if cluster:
        assert isinstance(gateway, Gateway)  # (its subscriptions need the real client)
        return ClusterWaiter(
            client, gateway, metrics=metrics, service=service, configure_flags=configure_flags
        )
    return Waiter(
        client, gateway, block_ms=block_ms, metrics=metrics, service=service, streams=streams
    )
