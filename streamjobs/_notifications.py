"""Keyspace notifications: the flags they need, and expiry subscriptions.

This module owns the pub/sub connections and the plain clients pinned to one
cluster node that carry them; the commands it needs besides PSUBSCRIBE go through
``_redis``.

One subscription on a standalone server, one per cluster primary.

Redis publishes a keyspace event only on the node that owns the key, replicas
publish no ``expired`` events, and keyspace events are classic (not sharded)
pub/sub, so on an OSS cluster every primary needs its own pinned subscription.
Topology changes do not always produce errors: after a graceful failover an old
subscription keeps running on what is now a replica, and a retrying client can
silently reconnect to a demoted node. So the watcher also compares the primary set
with what it subscribed to, periodically, and rebuilds when they differ.

Events only wake the lease sweep early; losing some costs latency, never work.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.abc
from redis.asyncio import Redis

from ._backoff import Backoff
from ._redis._admin import cluster_state, get_config, set_config
from ._redis._boundary import REDIS_FAILURES, Addr, SlotMap, translate
from ._redis._replies import text
from .exceptions import ClusterNotSettled, PermissionDenied, RedisUnavailable
from .metrics import MetricsRecorder

log = logging.getLogger(__name__)

KEYSPACE_EVENTS = "notify-keyspace-events"
# ``A`` is an alias for ``g$lshzxetd`` (and more on newer servers), so it already
# covers ``x``; ``K``/``E`` are never implied by ``A``.
_ALIAS_A = frozenset("g$lshzxetd")
_CONFIRM_TIMEOUT_S = 5.0

# Connection settings copied from the cluster client to per-node clients.
_NODE_KWARGS = (
    "username",
    "password",
    "socket_timeout",
    "socket_connect_timeout",
    "socket_keepalive",
    "ssl",
    "ssl_keyfile",
    "ssl_certfile",
    "ssl_cert_reqs",
    "ssl_ca_certs",
)


def node_client(cluster: Any, addr: Addr) -> Redis:
    """A plain client pinned to one cluster node, with the cluster client's credentials."""
    kwargs: Mapping[str, Any] = getattr(cluster, "connection_kwargs", {}) or {}
    picked = {k: kwargs[k] for k in _NODE_KWARGS if kwargs.get(k) is not None}
    picked.setdefault("socket_connect_timeout", 2.0)
    return Redis(host=addr[0], port=addr[1], **picked)


def merge_flags(current: str, needed: str) -> str | None:
    """The ``notify-keyspace-events`` value with ``needed`` merged in, or None if no change."""
    have = set(current)
    missing = [f for f in needed if f not in have and not ("A" in have and f in _ALIAS_A)]
    if not missing:
        return None
    return current + "".join(missing)


_hands_off_logged = False


def _log_hands_off_once(needed: str) -> None:
    global _hands_off_logged
    if not _hands_off_logged:
        _hands_off_logged = True
        log.info(
            "configure_keyspace_events=False: not reading or changing %s; make sure it "
            "contains %r on every node, or lock expiries are found by the lease sweep "
            "and the scanner only",
            KEYSPACE_EVENTS,
            needed,
        )


def describe(exc: BaseException) -> str:
    """``Type: message`` of the real cause; a refused permission says so."""
    inner = cause(exc)
    text_ = f"{type(inner).__name__}: {inner}"
    if "NOPERM" in str(inner):
        return f"permission denied, see docs/operations.md#least-privilege-acl: {text_}"
    return text_


def cause(exc: BaseException) -> BaseException:
    """The one exception inside (nested) single-member exception groups, for logs."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


async def ensure_keyspace_events(client: Any, needed: str, *, configure: bool) -> bool:
    """Make sure ``notify-keyspace-events`` on ``client``'s node has ``needed``.

    Merges with the flags already set (never drops one somebody else needs). With
    ``configure`` False it runs no CONFIG command at all (it logs once what the
    operator must set) and returns True. Never raises for a
    refused or renamed CONFIG (managed Redis): it warns and returns False, and
    recovery then relies on the scanner.

    Returns:
        True if the flags are set.
    """
    if not configure:
        # Hands-off (managed Redis): not even CONFIG GET, which such services refuse.
        _log_hands_off_once(needed)
        return True
    try:
        current = await get_config(client, KEYSPACE_EVENTS)
    except REDIS_FAILURES as exc:
        log.warning("cannot read %s (%s): relying on the scanner", KEYSPACE_EVENTS, exc)
        return False
    merged = merge_flags(current, needed)
    if merged is None:
        return True
    try:
        await set_config(client, KEYSPACE_EVENTS, merged)
    except REDIS_FAILURES as exc:
        log.warning("cannot set %s (%s): relying on the scanner", KEYSPACE_EVENTS, exc)
        return False
    return True


@dataclass(frozen=True, slots=True)
class Topology:
    primaries: frozenset[Addr]
    settled: bool
    reason: str = ""


def known_nodes(cluster: Any) -> set[Addr]:
    nodes = {(n.host, int(n.port)) for n in cluster.get_nodes()}
    for n in getattr(cluster.nodes_manager, "startup_nodes", {}).values():
        nodes.add((n.host, int(n.port)))
    return nodes


async def cluster_view(cluster: Any) -> Topology:
    """Ask every known node for its state and slot map (pure reads; changes nothing).

    Settled means every reachable node says ``cluster_state:ok``, all of them report
    the same slot owners, and every owner is reachable.
    """
    views: dict[Addr, SlotMap] = {}
    reachable: set[Addr] = set()
    problems: list[str] = []
    for addr in sorted(known_nodes(cluster)):
        r = node_client(cluster, addr)
        try:
            with anyio.fail_after(3):
                state, slots = await cluster_state(r)
        except Exception as exc:  # any odd answer counts as unreachable
            problems.append(f"{addr[0]}:{addr[1]} unreachable ({type(exc).__name__})")
            continue
        finally:
            # Shielded: when the watcher is cancelled mid-check, an unshielded close
            # would be cancelled too and leak the socket. A close that fails (redis-py
            # raises TimeoutError when a dead node's socket will not close in 5 s) is
            # only a socket left to the garbage collector: it must not end the check,
            # nor the watcher, nor the worker (the 30-minute cluster soak saw that).
            with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
                await r.aclose()
        reachable.add(addr)
        if state != "ok":
            problems.append(f"{addr[0]}:{addr[1]} reports cluster_state:{state}")
        views[addr] = slots
    if not views:
        raise RedisUnavailable("no cluster node answered: " + "; ".join(problems))
    maps = list(views.values())
    owners = frozenset(a for m in maps for a in m.values())
    settled = not [p for p in problems if "cluster_state" in p]
    if any(m != maps[0] for m in maps[1:]):
        settled = False
        problems.append("nodes disagree on slot ownership")
    if owners - reachable:
        settled = False
        problems.append("a slot owner is unreachable")
    return Topology(frozenset(maps[0].values()), settled, "; ".join(problems))


async def subscribe(
    client: Redis,
    pattern: str,
    on_expired: Callable[[], None],
    metrics: MetricsRecorder,
    service: str,
    *,
    task_status: anyio.abc.TaskStatus[None],
) -> None:
    """PSUBSCRIBE ``pattern`` on ``client`` and call ``on_expired`` for each expiry.

    Returns (after closing the subscription) when the connection fails; cancellation
    closes it too.
    """
    pubsub = client.pubsub()
    try:
        # Started only once the server confirmed: a refusal (NOPERM) raises here.
        await _psubscribe_confirmed(pubsub, pattern)
        task_status.started()
        while True:
            msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
            if msg is not None and text(msg.get("data", b"")) == "expired":
                metrics.notification(service, "expired")
                on_expired()
    finally:
        with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
            await pubsub.aclose()  # type: ignore[no-untyped-call]


async def _psubscribe_confirmed(pubsub: Any, pattern: str) -> None:
    """PSUBSCRIBE ``pattern`` and return once the server confirmed it (a refusal,
    NOPERM, raises; no confirmation within ``_CONFIRM_TIMEOUT_S``: TimeoutError)."""
    await pubsub.psubscribe(pattern)
    with anyio.fail_after(_CONFIRM_TIMEOUT_S):
        while True:
            msg = await pubsub.get_message(ignore_subscribe_messages=False, timeout=1.0)
            if msg is not None and text(msg.get("type", b"")) == "psubscribe":
                return


async def probe_subscription(client: Redis, pattern: str) -> None:
    """PSUBSCRIBE ``pattern`` and wait for the confirmation, then leave.

    Raises:
        PermissionDenied: the user may not subscribe to ``pattern`` (NOPERM).
    """
    pubsub = client.pubsub()
    try:
        await _psubscribe_confirmed(pubsub, pattern)
    except Exception as exc:
        error = translate(exc)
        if isinstance(error, PermissionDenied):
            raise PermissionDenied(f"PSUBSCRIBE {pattern} refused: {error}") from exc
        raise
    finally:
        with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
            await pubsub.aclose()  # type: ignore[no-untyped-call]


class ClusterWatcher:
    """Keeps exactly one expiry subscription per current primary of an OSS cluster."""

    def __init__(
        self,
        cluster: Any,
        pattern: str,
        *,
        ensure_flags: Callable[[Any], Awaitable[bool]],
        on_expired: Callable[[], None],
        metrics: MetricsRecorder,
        service: str,
        check_interval_s: float,
    ) -> None:
        self._cluster = cluster
        self._pattern = pattern
        self._ensure_flags = ensure_flags
        self._on_expired = on_expired
        self._metrics = metrics
        self._service = service
        self._check_interval_s = check_interval_s
        self._rebuild = anyio.Event()
        self._rebuilt = anyio.Event()
        self.subscribed: frozenset[Addr] = frozenset()
        self.generation = 0

    async def reset(self) -> None:
        """Refresh the slot map, check the cluster is settled, rebuild subscriptions.

        Raises:
            ClusterNotSettled: some node is not ``ok``, nodes disagree on slot owners, or
                an owner is unreachable. Nothing was changed.
        """
        try:
            view = await cluster_view(self._cluster)
        except Exception:
            self._metrics.topology_reset(self._service, "failed")
            raise
        if not view.settled:
            self._metrics.topology_reset(self._service, "not_settled")
            raise ClusterNotSettled(view.reason)
        try:
            await self._cluster.nodes_manager.initialize()
        except Exception:
            self._metrics.topology_reset(self._service, "failed")
            raise
        done = self._rebuilt
        self._rebuild.set()
        await done.wait()

    async def run(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        started = False
        backoff = Backoff(cap_s=5.0)
        while True:
            try:
                view = await cluster_view(self._cluster)
            except RedisUnavailable as exc:
                if not started:
                    raise
                log.warning("cluster topology unavailable (%s)", exc)
                await anyio.sleep(backoff.next_delay())
                continue
            changed = anyio.Event()
            async with anyio.create_task_group() as tg:
                ok = await self._subscribe_all(tg, view.primaries, changed)
                if started:  # a rebuild: requested, a subscription died, primaries moved
                    result = "ok" if len(ok) == len(view.primaries) else "partial"
                    self._metrics.topology_reset(self._service, result if ok else "failed")
                if not ok:
                    if not started:
                        raise RedisUnavailable(
                            "could not configure or subscribe keyspace notifications on "
                            f"any primary of the cluster ({sorted(view.primaries)})"
                        )
                    tg.cancel_scope.cancel()
                    await anyio.sleep(backoff.next_delay())
                    continue
                backoff.reset()
                self.subscribed = frozenset(ok)
                self.generation += 1
                # Events may have been missed while (re)subscribing.
                self._on_expired()
                rebuilt, self._rebuilt = self._rebuilt, anyio.Event()
                rebuilt.set()
                if not started:
                    started = True
                    task_status.started()
                await self._watch(view.primaries, changed)
                tg.cancel_scope.cancel()
            self.subscribed = frozenset()

    async def _subscribe_all(
        self, tg: anyio.abc.TaskGroup, primaries: frozenset[Addr], changed: anyio.Event
    ) -> list[Addr]:
        ok: list[Addr] = []
        for addr in sorted(primaries):
            client = node_client(self._cluster, addr)
            try:
                with anyio.fail_after(5):
                    await self._ensure_flags(client)
                    await tg.start(self._node_subscription, client, addr, changed)
                ok.append(addr)
                self._metrics.keyspace_setup(self._service, "ok")
            except BaseException as exc:
                with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
                    await client.aclose()
                if not isinstance(exc, Exception):
                    raise
                self._metrics.keyspace_setup(self._service, "failed")
                self._metrics.notification(self._service, "subscribe_failed")
                log.warning(
                    "cannot subscribe on primary %s:%s (%s)", addr[0], addr[1], describe(exc)
                )
        return ok

    async def _node_subscription(
        self,
        client: Redis,
        addr: Addr,
        changed: anyio.Event,
        *,
        task_status: anyio.abc.TaskStatus[None],
    ) -> None:
        try:
            await subscribe(
                client,
                self._pattern,
                self._on_expired,
                self._metrics,
                self._service,
                task_status=task_status,
            )
        except Exception as exc:
            self._metrics.notification(self._service, "dropped")
            log.warning(
                "subscription on %s:%s lost (%s): rebuilding", addr[0], addr[1], describe(exc)
            )
            changed.set()
        finally:
            with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
                await client.aclose()

    async def _watch(self, primaries: frozenset[Addr], changed: anyio.Event) -> None:
        """Return when a rebuild is due: requested, a subscription died, or primaries moved."""
        while True:
            with anyio.move_on_after(self._check_interval_s):
                async with anyio.create_task_group() as tg:

                    async def wait(event: anyio.Event) -> None:
                        await event.wait()
                        tg.cancel_scope.cancel()

                    tg.start_soon(wait, self._rebuild)
                    tg.start_soon(wait, changed)
            if self._rebuild.is_set():
                self._rebuild = anyio.Event()
                return
            if changed.is_set():
                return
            try:
                view = await cluster_view(self._cluster)
            except RedisUnavailable:
                continue
            except Exception as exc:  # one odd reply never ends the watcher
                self._metrics.loop_error(self._service, "subscriber")
                log.warning("checking the cluster topology failed (%s)", describe(exc))
                continue
            if view.primaries != primaries and view.settled:
                log.info("cluster primaries changed: rebuilding keyspace subscriptions")
                with contextlib.suppress(Exception):
                    await self._cluster.nodes_manager.initialize()
                return
