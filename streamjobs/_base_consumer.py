"""What both consumer kinds are to their user: the base of
:class:`~streamjobs.StreamConsumer` and :class:`~streamjobs.GroupConsumer`.

``handle()``, the two hooks every kind calls, and the ``@final`` framework methods that
start, stop and observe a consumer. Everything that runs lives in a private runtime
held under one name-mangled attribute, so a subclass may use any attribute or method
name of its own (``_config``, ``_run``, ``_redis``, ...) without breaking the framework.
"""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar, Generic, Protocol, Self, final

import anyio
import anyio.abc

from ._checks import check_block, check_client, check_cluster_mode, check_subclass
from ._keys import Keys
from ._lifecycle import Lifecycle
from ._redis._gateway import Gateway
from ._stats import ConsumerStatistics
from .config import ClusterMode, ConsumerConfig, RecoveryConfig, default_min_idle_s
from .message import F, Message

Probe = Callable[[], tuple[bool, str]]


class ConsumerRuntime(Protocol):
    """What a consumer kind's runtime offers its facade."""

    service: str
    name: str
    client: Any
    life: Lifecycle
    """Its runs: start, stop, readiness, ``async with`` (the same for every kind)."""

    def health(self) -> tuple[bool, str]: ...
    def readiness(self) -> tuple[bool, str]: ...
    def statistics(self) -> ConsumerStatistics: ...
    async def run(self, task_status: anyio.abc.TaskStatus[None]) -> None: ...


class BaseConsumer(abc.ABC, Generic[F]):
    """The user's contract, shared by both consumer kinds: implement :meth:`handle`."""

    fields_type: ClassVar[type[str] | type[bytes]] = str
    """What ``handle()`` gets field names and values as: set from the class's
    declaration (``StreamConsumer[bytes]``, ``GroupConsumer[bytes]``), or by a
    subclass itself."""

    def __init__(self, runtime: ConsumerRuntime) -> None:
        self.__runtime = runtime

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        check_subclass(cls, BaseConsumer)

    # -- the subclass contract -------------------------------------------------------

    @abc.abstractmethod
    def handle(self, message: Message[F]) -> Awaitable[None] | None:
        """Process one entry. Called in order within a stream, concurrently across streams.

        Define it as ``async def handle(self, message)``, or as a plain
        ``def handle(self, message)`` for blocking code: that runs in a worker thread
        (at most 40 at once per consumer), with the same retries, timeout and dead
        letters. A plain handler past ``handler_timeout_s`` is no longer waited for,
        but its thread runs on until it returns.

        Return to have the entry acknowledged. Raise `Retry` to retry after a
        delay, `DeadLetter` to dead-letter it now, or any other exception to
        retry with backoff up to ``max_handler_attempts`` (then it is dead-lettered
        with reason ``handler_failed`` and the next entry follows). A ``GroupConsumer``'s
        ``message.info`` is empty: a shared group's entries come from any producer, not
        from an assignment.
        """

    async def on_startup(self) -> None:
        """Called once by :meth:`run`, once Redis answered and before the first read:
        open what the handlers need (a database pool, an HTTP client) here, not in
        ``__init__``. If it raises, ``run()`` raises :class:`HookFailed` and nothing
        is read; :meth:`on_shutdown` is still called."""

    async def on_shutdown(self) -> None:
        """Called once at the end of :meth:`run`, after the last handler returned and
        everything held was handed on; also after a start that failed, so that what
        :meth:`on_startup` opened is closed. If it raises, ``run()`` raises
        :class:`HookFailed` (unless it is already raising another error)."""

    # -- public framework API ---------------------------------------------------------

    @final
    @property
    def service(self) -> str:
        """The service this consumer works for (its consumer groups' name)."""
        return self.__runtime.service

    @final
    @property
    def consumer_name(self) -> str:
        """This consumer's name in its consumer groups."""
        return self.__runtime.name

    @final
    @property
    def redis(self) -> Any:
        """The Redis client this consumer was built with, for a handler's own commands.

        It is the same object that was passed in (``Redis`` or ``RedisCluster``); the
        consumer never closes it. Keys a handler writes are its own business: name
        them so they cannot collide with the service's (docs/design.md#keys).
        """
        return self.__runtime.client

    @final
    def statistics(self) -> ConsumerStatistics:
        """A frozen snapshot: streams held, handlers in flight, the last Redis reply and
        scanner or reclaim pass, health and readiness, and counts of what happened."""
        return self.__runtime.statistics()

    @final
    async def wait_ready(self) -> None:
        """Wait until :meth:`run` has started all its loops (a ``GroupConsumer`` has
        also joined the group on every stream, or tried for one session TTL)."""
        await self.__runtime.life.wait_ready()

    @final
    async def aclose(self) -> None:
        """Stop gracefully and wait until :meth:`run` returned.

        Reading stops, in-flight handlers get ``shutdown_grace_s`` to finish, and what
        this consumer holds goes on to the others at once: a ``StreamConsumer`` hands
        back every unfinished stream, a ``GroupConsumer`` acknowledges what it handled
        and leaves what it read but did not handle to the other members.
        """
        await self.__runtime.life.aclose()

    @final
    async def __aenter__(self) -> Self:
        await self.__runtime.life.enter(self.run)
        return self

    @final
    async def __aexit__(self, *exc: object) -> None:
        await self.__runtime.life.exit()

    @final
    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Consume until :meth:`aclose` is called or this task is cancelled.

        Raises:
            RedisUnavailable: Redis could not be reached at start-up.
            HookFailed: ``on_startup`` or ``on_shutdown`` raised.
        """
        await self.__runtime.run(task_status)


def settings(
    redis: Any,
    config: ConsumerConfig | None,
    recovery: RecoveryConfig | None,
    cluster_mode: ClusterMode,
) -> tuple[ConsumerConfig, RecoveryConfig]:
    """The settings a consumer of either kind runs with: the defaults where none were
    given (``min_idle_s`` from the lock TTL), checked against each other and against
    the client (its decoding, its socket timeout, the cluster mode)."""
    config = config or ConsumerConfig()
    recovery = recovery or RecoveryConfig(min_idle_s=default_min_idle_s(config.lock_ttl_s))
    recovery.check_against(config)
    check_client(redis)
    check_block(redis, config)
    check_cluster_mode(redis, cluster_mode)
    return config, recovery


def service_gateway(
    redis: Any, keys: Keys, recovery: RecoveryConfig, fields_type: type[str] | type[bytes]
) -> Gateway:
    """The gateway of a consumer of either kind: its dead-letter stream checked, and
    data entries read as ``fields_type``."""
    if recovery.dlq_stream is not None:
        keys.check_dlq_name(recovery.dlq_stream)
    gateway = Gateway(redis, keys, dlq=recovery.dlq_stream, dlq_maxlen=recovery.dlq_maxlen)
    gateway.raw_fields = fields_type is bytes
    return gateway


def probes(consumer: BaseConsumer[Any]) -> tuple[Probe, Probe]:
    """``consumer``'s liveness and readiness checks, callable from any thread (the
    worker's HTTP endpoint); each answers (ok, a one-line reason)."""
    runtime: ConsumerRuntime = consumer._BaseConsumer__runtime  # type: ignore[attr-defined]
    return runtime.health, runtime.readiness
