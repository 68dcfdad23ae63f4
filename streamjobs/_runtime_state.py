"""A consumer runtime's state, and what its streams call on it (the ``Host``
protocol of :mod:`streamjobs._stream_state`): the base of
:class:`~streamjobs._runtime.Runtime`."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import anyio
import anyio.abc

from ._cluster_waiter import ClusterWaiter, idle_wait
from ._coalesce import Coalescer
from ._lifecycle import Lifecycle
from ._ownership import OwnedStream
from ._pipeline import EntryPipeline, Hooks
from ._recovery import Recoverer
from ._recovery_loops import RecoveryLoops
from ._redis import Gateway, StreamGateway
from ._session import new_incarnation, session_token
from ._stats import Tally
from ._stream_state import StreamState
from ._waiter import Waiter
from .config import ClusterMode, ConsumerConfig, Liveness, RecoveryConfig
from .metrics import MetricsRecorder, NullRecorder, complete

log = logging.getLogger("streamjobs._runtime")  # one logger for the runtime's parts

PULSE_S = 1.0
"""How often the pulse loop turns, and how long Redis may be silent before a PING."""
READY_WITHIN_S = 5.0
"""Ready only if a command got a reply this recently."""
HEALTHY_WITHIN_S = 10.0
"""Healthy only if the pulse loop turned this recently (the event loop is not stuck)."""


class RuntimeState:
    """The running machinery of one consumer. Constructing it does no I/O.

    Args:
        hooks: the user's ``handle()`` and hooks.
        gateway: the Redis commands (or a fake of them).
        client: the Redis client, for keyspace subscriptions (unused in PROXY mode).
        name: the consumer's name in the consumer groups.
    """

    def __init__(
        self,
        hooks: Hooks,
        gateway: StreamGateway,
        *,
        client: Any,
        name: str,
        config: ConsumerConfig,
        recovery: RecoveryConfig,
        cluster_mode: ClusterMode,
        metrics: MetricsRecorder,
    ) -> None:
        self.hooks = hooks
        self.gateway = gateway
        self.client = client
        self.config = config
        self.tally = Tally(complete(metrics))
        self.metrics: MetricsRecorder = self.tally
        # Sampling the queue is for a recorder's gauges: not done for the default one.
        self._sampled = type(metrics) is not NullRecorder
        self.name = name
        self.service = gateway.keys.service
        self.cluster_mode = cluster_mode
        self.pipeline = EntryPipeline(
            hooks.handle,
            config=config,
            metrics=self.metrics,
            service=self.service,
            consumer=name,
            group=gateway.keys.group,
            dead_letters=gateway,
        )
        self.recoverer = Recoverer(
            gateway,
            max_retries=recovery.max_retries,
            metrics=self.metrics,
            service=self.service,
            consumer=name,
        )
        self.loops = RecoveryLoops(
            client,
            gateway,
            self.recoverer,
            recovery=recovery,
            consumer=config,
            cluster_mode=cluster_mode,
            metrics=self.metrics,
            name=name,
        )
        self.owned: dict[str, StreamState] = {}
        self.entry_size_hint = config.read_batch_bytes  # unknown: read one entry first
        shared = (cluster_mode is ClusterMode.NONE and client is not None) or (
            cluster_mode is ClusterMode.OSS and isinstance(gateway, Gateway)
        )
        self.waiter: Waiter | ClusterWaiter | None = (
            idle_wait(
                client,
                gateway,
                cluster=cluster_mode is ClusterMode.OSS,
                block_ms=config.read_block_ms,
                streams=config.max_concurrent_streams,
                metrics=self.metrics,
                service=self.service,
                configure_flags=recovery.configure_keyspace_events,
            )
            if shared
            else None
        )
        self._streams: set[OwnedStream] = set()  # acquiring, owned, or handing back
        self._slot_freed = anyio.Event()
        self._all_done = anyio.Event()
        self._all_done.set()
        self._intake_done = anyio.Event()
        self._draining = False
        self.life = Lifecycle(hooks)
        self._pulse_at = 0.0  # monotonic time of the pulse loop's last turn
        self.session_mode = config.liveness is Liveness.SESSION
        self.session_confirmed_at: float | None = None
        self._session_changed = anyio.Event()
        self._new_incarnation()
        self._group_missing = False  # intake's last read found no group
        self._streams_tg: anyio.abc.TaskGroup | None = None
        self._stream_tasks: set[asyncio.Task[None]] = set()  # see _start_stream
        self._leases: Coalescer[str, bool] = Coalescer(self._take_leases)

    # -- what OwnedStream needs (the Host protocol) --------------------------------------

    @property
    def draining(self) -> bool:
        return self._draining

    @property
    def lock_ttl_ms(self) -> int:
        cfg = self.config
        return cfg.session_lock_ttl_ms if self.session_mode else cfg.lock_ttl_ms

    async def take_lease(self, assignment_id: str) -> bool:
        return await self._leases(assignment_id)

    async def _take_leases(self, ids: Sequence[str]) -> list[bool]:
        return await self.gateway.take_leases(ids, self.name, self.lock_ttl_ms)

    def lock_token(self) -> str:
        if self.session_mode:
            return session_token(self._incarnation, self.name, self.service)
        return f"{self.name}:{secrets.token_hex(8)}"

    def _new_incarnation(self) -> None:
        """A new session identity: at start, and after a session was found dead."""
        self._incarnation = new_incarnation()
        self._session_value = json.dumps(
            {
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "started_at": time.time(),
                "incarnation": self._incarnation,
            }
        )

    def adopt(self, stream: StreamState) -> None:
        previous = self.owned.get(stream.stream)
        if previous is not None and previous is not stream:
            # This consumer took the stream again (it stalled past its TTL and then
            # read its own re-queued assignment): the new lock proves the old one gone.
            previous.mark_lost()
        self.owned[stream.stream] = stream
        self.metrics.owned_streams(self.service, len(self.owned))

    def disown(self, stream: StreamState) -> None:
        if self.owned.get(stream.stream) is stream:
            del self.owned[stream.stream]
            self.metrics.owned_streams(self.service, len(self.owned))

    def spawn(self, fn: Callable[[], Coroutine[Any, Any, None]]) -> None:
        assert self._streams_tg is not None
        self._streams_tg.start_soon(fn)
