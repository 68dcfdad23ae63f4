"""What the runtimes of both consumer kinds hold alike: the base of
``_runtime.Runtime`` (``StreamConsumer``) and ``_group.GroupRuntime`` (``GroupConsumer``).

The user's hooks, the gateway, the settings, the counts (``Tally``), the entry pipeline
(``_pipeline``), the lifecycle (``_lifecycle``) and the statistics built from them. Each
kind adds how it reads and what it holds."""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any, Protocol

from ._keys import Keys
from ._lifecycle import Lifecycle
from ._pipeline import BaseHooks, DeadLetterSink, EntryPipeline
from ._stats import ConsumerStatistics, Tally
from .config import ConsumerConfig, RecoveryConfig
from .metrics import MetricsRecorder, complete


@dataclass(frozen=True, slots=True)
class Parts:
    """What a runtime of either kind is made of.

    Attributes:
        hooks: the user's ``handle()`` and hooks.
        gateway: the Redis commands (or a fake of them).
        client: the Redis client (idle waits and subscriptions use it).
        name: the consumer's name in its consumer groups.
        config, recovery: the settings.
        metrics: the user's recorder; every event is also counted for statistics.
    """

    hooks: Any
    gateway: Any
    client: Any
    name: str
    config: ConsumerConfig
    recovery: RecoveryConfig
    metrics: MetricsRecorder


class _Gateway(Protocol):
    """What the shared part uses of either kind's gateway."""

    @property
    def keys(self) -> Keys: ...
    @property
    def assignments(self) -> DeadLetterSink: ...


class KindRuntime(abc.ABC):
    """The part of a running consumer that both kinds share. Constructing it does no I/O."""

    gateway: _Gateway

    def __init__(self, parts: Parts) -> None:
        hooks: BaseHooks = parts.hooks
        gateway: _Gateway = parts.gateway
        name, config = parts.name, parts.config
        self.hooks = hooks
        self.gateway = gateway
        self.client = parts.client
        self.name = name
        self.service = gateway.keys.service
        self.config = config
        self.recovery = parts.recovery
        self.tally = Tally(complete(parts.metrics))
        self.metrics: MetricsRecorder = self.tally
        self.pipeline = EntryPipeline(
            hooks.handle,
            config=config,
            metrics=self.metrics,
            service=self.service,
            consumer=name,
            group=gateway.keys.group,
            dead_letters=gateway.assignments,
        )
        self.life = Lifecycle(hooks)

    @abc.abstractmethod
    def health(self) -> tuple[bool, str]:
        """Liveness: (alive, why not)."""

    @abc.abstractmethod
    def readiness(self) -> tuple[bool, str]:
        """Readiness: (ready, why not)."""

    @abc.abstractmethod
    def held(self) -> tuple[int, int]:
        """Streams held now (owned, or with a live member), and those in a batch of
        ``handle()`` calls."""

    def statistics(self) -> ConsumerStatistics:
        held, handling = self.held()
        return self.tally.statistics(
            service=self.service,
            consumer=self.name,
            running=self.life.started,
            healthy=self.health()[0],
            ready=self.readiness()[0],
            owned_streams=held,
            in_flight_handlers=handling,
            last_redis_ok=getattr(self.gateway, "last_ok", None),
        )
