"""Configuration: frozen, keyword-only dataclasses validated on construction.

Every duration or size carries its unit in its name. A bad value raises
:class:`~streamjobs.ConfigurationError` naming the field and the rule.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

from ._keys import DEFAULT_PREFIX
from .exceptions import ConfigurationError

_MIN_IDLE_FLOOR_S = 15.0
_MIN_IDLE_PER_TTL = 1.5


def default_min_idle_s(lock_ttl_s: float) -> float:
    """``RecoveryConfig.min_idle_s`` when none is given: 15 s, or 1.5 lock TTLs if longer.

    It must exceed the lock TTL: an assignment idle for less may still be owned.
    """
    return max(_MIN_IDLE_FLOOR_S, lock_ttl_s * _MIN_IDLE_PER_TTL)


class ClusterMode(enum.Enum):
    """How the Redis deployment is laid out."""

    NONE = "none"
    """Standalone, primary/replica or Sentinel: one keyspace subscription."""
    OSS = "oss"
    """OSS Redis Cluster: configuration and subscriptions on every primary."""
    PROXY = "proxy"
    """One endpoint in front of many shards: no subscriptions, the scanner recovers."""


class Liveness(enum.Enum):
    """What keeps a consumer's streams its own (docs/design.md#liveness).

    Fencing is the same either way: every read and ack checks the token in the
    stream's lock. What differs is how a dead owner's lock stops being valid.
    """

    LOCK = "lock"
    """Every owned lock has the lock TTL and every heartbeat extends each of them: a
    dead owner's locks expire. Heartbeats cost O(owned streams)."""
    SESSION = "session"
    """Each lock names the consumer's session; the heartbeat renews only the session
    key. A dead owner's session expires and recovery replaces its locks. Heartbeats
    cost O(1); a lock is extended only every ``session_lock_ttl_s / 3`` (a bound on
    leaked locks). For consumers holding hundreds or thousands of streams."""


def _finite(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigurationError(name, f"must be a finite number, got {value!r}")


def _positive(name: str, value: float) -> None:
    _finite(name, value)
    if value <= 0:
        raise ConfigurationError(name, f"must be > 0, got {value!r}")


def _non_negative(name: str, value: float) -> None:
    _finite(name, value)
    if value < 0:
        raise ConfigurationError(name, f"must be >= 0, got {value!r}")


def _int_at_least(name: str, value: int, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigurationError(name, f"must be an int, got {value!r}")
    if value < low:
        raise ConfigurationError(name, f"must be >= {low}, got {value!r}")


@dataclass(frozen=True, kw_only=True, slots=True)
class ConsumerConfig:
    """How one consumer owns and processes streams.

    Attributes:
        lock_ttl_s: lifetime of a stream lock; an owner silent this long loses the stream.
        heartbeat_interval_s: how often locks are extended; default ``lock_ttl_s / 3``;
            must be below ``lock_ttl_s / 2``.
        lease_margin_s: safety margin subtracted from the local lease deadline; default
            10% of ``lock_ttl_s``. Past ``last extend + lock_ttl_s - lease_margin_s`` no entry
            is handed to ``handle()`` until an extend succeeds.
        max_concurrent_streams: streams owned at once; intake reads only free slots.
        redis_concurrency: most commands the consumer has in flight at once, blocking
            reads aside; it bounds the connections it opens, however many of its
            streams act together (docs/operations.md#size-and-time-limits).
        read_batch_size: data entries read (and acked) per round trip, at most.
        read_batch_bytes: bytes a read aims to stay under: each read asks for as many
            entries as fit if they are as large as the largest entry of the stream's
            previous batch (the first read of a stream goes by the consumer's last
            batch, and the consumer's first read takes one entry). An entry larger
            than this is read alone. Bounds the memory of a batch and the time Redis
            spends on one read (docs/operations.md#size-and-time-limits).
        read_block_ms: how long an idle read blocks; bounds how quickly shutdown is noticed.
        max_handler_attempts: attempts per entry before it is dead-lettered.
        handler_backoff_s: delay before the second attempt; doubles per attempt.
        handler_backoff_max_s: cap of that delay.
        shutdown_grace_s: time in-flight handlers get to finish on shutdown; streams
            not in a handler are handed back at once, and those whose handler is still
            running when it ends are cancelled and handed back. The default, 5 s, lets a
            whole shutdown (at most ``read_block_ms`` + grace + a few round trips) end
            inside ``docker stop``'s 10 s (docs/operations.md#signals-shutdown-and-supervisors).
        require_noeviction: refuse to start (``ConfigurationError`` naming
            ``maxmemory-policy``) unless the server's ``maxmemory-policy`` is
            ``noeviction`` (on a cluster: every primary's). Any other policy lets Redis
            evict locks and the assignment stream under memory pressure, which loses
            work. False is the explicit override: start anyway, with a warning.
        handler_timeout_s: longest a ``handle()`` call may run; past it the call is
            cancelled and counts as a failed attempt (retried with backoff, then
            dead-lettered). None (the default) lets a call run for as long as it takes,
            holding its stream meanwhile.
        finished_stream_ttl_s: TTL set on a data stream once it is finished; 0 deletes
            it at once, None keeps it.
        stream_idle_timeout_s: an owned stream that gets no new entry (and no end
            marker) for this long is abandoned: its assignment is dead-lettered with
            reason ``idle_timeout``, its lock released, and the stream gets the
            ``finished_stream_ttl_s`` retention, so an assignment for a stream nobody
            writes to cannot hold a slot, or an empty key, forever. None waits forever.
        sample_interval_s: how often the service's queue is sampled for a recorder's
            gauges (pending assignments, the oldest one's age, the DLQ's length,
            consumers in the group): four cheap reads. Only with a recorder other than
            the default; None turns it off.
        key_prefix: prefix of every key (docs/design.md#keys).
        liveness: how an owner proves it is alive (:class:`Liveness`): ``SESSION``, the
            default (one session key renewed per heartbeat), or ``LOCK`` (every lock
            renewed every heartbeat: for fleets that share streams with the Go library,
            whose consumers read a lock as alive while it exists;
            docs/design.md#liveness).
    """

    lock_ttl_s: float = 10.0
    heartbeat_interval_s: float | None = None
    lease_margin_s: float | None = None
    max_concurrent_streams: int = 10
    redis_concurrency: int = 16
    read_batch_size: int = 100
    read_batch_bytes: int = 4 * 1024 * 1024
    read_block_ms: int = 1000
    max_handler_attempts: int = 3
    handler_backoff_s: float = 0.1
    handler_backoff_max_s: float = 5.0
    shutdown_grace_s: float = 5.0
    handler_timeout_s: float | None = None
    require_noeviction: bool = True
    finished_stream_ttl_s: float | None = 3600.0
    stream_idle_timeout_s: float | None = 3600.0
    sample_interval_s: float | None = 15.0
    key_prefix: str = DEFAULT_PREFIX
    liveness: Liveness = Liveness.SESSION

    def __post_init__(self) -> None:
        _positive("lock_ttl_s", self.lock_ttl_s)
        if self.lock_ttl_s < 0.1:
            raise ConfigurationError("lock_ttl_s", "must be >= 0.1 (locks use millisecond TTLs)")
        if self.heartbeat_interval_s is not None:
            _positive("heartbeat_interval_s", self.heartbeat_interval_s)
            if self.heartbeat_interval_s >= self.lock_ttl_s / 2:
                raise ConfigurationError(
                    "heartbeat_interval_s",
                    f"must be < lock_ttl_s / 2 ({self.lock_ttl_s / 2}), "
                    f"got {self.heartbeat_interval_s}",
                )
        if self.lease_margin_s is not None:
            _non_negative("lease_margin_s", self.lease_margin_s)
            if self.lease_margin_s >= self.lock_ttl_s - self.heartbeat_s:
                raise ConfigurationError(
                    "lease_margin_s", "must be < lock_ttl_s - heartbeat_interval_s"
                )
        _int_at_least("max_concurrent_streams", self.max_concurrent_streams, 1)
        _int_at_least("redis_concurrency", self.redis_concurrency, 1)
        _int_at_least("read_batch_size", self.read_batch_size, 1)
        if self.read_batch_size > 5000:
            raise ConfigurationError(
                "read_batch_size", "must be <= 5000 (one script call acks a batch)"
            )
        _int_at_least("read_batch_bytes", self.read_batch_bytes, 1)
        _int_at_least("read_block_ms", self.read_block_ms, 1)
        _int_at_least("max_handler_attempts", self.max_handler_attempts, 1)
        _non_negative("handler_backoff_s", self.handler_backoff_s)
        _non_negative("handler_backoff_max_s", self.handler_backoff_max_s)
        _non_negative("shutdown_grace_s", self.shutdown_grace_s)
        if not isinstance(self.require_noeviction, bool):
            raise ConfigurationError("require_noeviction", "must be a bool")
        if self.handler_timeout_s is not None:
            _positive("handler_timeout_s", self.handler_timeout_s)
        if self.finished_stream_ttl_s is not None:
            _non_negative("finished_stream_ttl_s", self.finished_stream_ttl_s)
        if self.stream_idle_timeout_s is not None:
            _positive("stream_idle_timeout_s", self.stream_idle_timeout_s)
        if self.sample_interval_s is not None:
            _positive("sample_interval_s", self.sample_interval_s)
        if not self.key_prefix or any(c in self.key_prefix for c in "{} \t\n"):
            raise ConfigurationError(
                "key_prefix", "must be non-empty, without braces or whitespace"
            )
        if not isinstance(self.liveness, Liveness):
            raise ConfigurationError(
                "liveness", f"must be a streamjobs.Liveness, got {self.liveness!r}"
            )

    @property
    def heartbeat_s(self) -> float:
        """Effective heartbeat interval."""
        if self.heartbeat_interval_s is not None:
            return self.heartbeat_interval_s
        return self.lock_ttl_s / 3

    @property
    def margin_s(self) -> float:
        """Effective local lease safety margin."""
        if self.lease_margin_s is not None:
            return self.lease_margin_s
        return self.lock_ttl_s * 0.1

    @property
    def lock_ttl_ms(self) -> int:
        return max(1, round(self.lock_ttl_s * 1000))

    @property
    def session_lock_ttl_ms(self) -> int:
        """TTL of a lock under ``Liveness.SESSION``: 60 lock TTLs, at least 10 minutes.

        Liveness is the session's; this only bounds how long a lock can outlive an
        owner that died between completing its assignment and releasing the lock.
        """
        return max(600_000, 60 * self.lock_ttl_ms)


@dataclass(frozen=True, kw_only=True, slots=True)
class RecoveryConfig:
    """How dead or stalled owners are detected and their work re-queued.

    Attributes:
        interval_s: period of the XPENDING reconciliation scan.
        jitter_fraction: each wait is ``interval_s * (1 + U(0, jitter_fraction))``.
        min_idle_s: pending assignments idle for less than this are not inspected by
            the scan; must exceed the consumer's ``lock_ttl_s``. When no
            ``RecoveryConfig`` is given, a consumer uses :func:`default_min_idle_s`
            of its ``lock_ttl_s``.
        batch_size: XPENDING page size.
        scan_budget_s: longest one scan pass pages through the pending list. One
            consumer per service runs the pass of each interval (it holds an expiring
            lease); it resumes from a cursor kept in Redis, so a long pending list is
            covered over several intervals at a bounded cost per interval.
        max_retries: re-queues after owner deaths before an assignment is dead-lettered.
        dlq_stream: dead-letter stream name; default ``P:{service}:dlq``. A custom name
            must hash to the assignment stream's cluster slot, so give it the hash tag
            ``{service}`` (e.g. ``P:{service}:dead``), and must not be the assignment
            stream or the lease index. ``StreamConsumer`` checks this in every cluster
            mode (a standalone deployment may become a cluster later) and raises
            ``ConfigurationError("dlq_stream", ...)``.
        dlq_maxlen: approximate cap of the dead-letter stream (``MAXLEN ~``); 0 = unbounded.
        lease_check_interval_s: longest pause of the lease sweep, which finds expired
            locks without waiting for Redis to expire them; it also wakes at the
            earliest lease or session deadline (see docs/recovery.md).
        notification_delay_max_s: a keyspace expiry is acted on after ``U(0, this)``,
            so a fleet does not stampede.
        configure_keyspace_events: merge the needed flags into
            ``notify-keyspace-events``; when False, never run CONFIG SET, only warn.
        topology_check_interval_s: ``ClusterMode.OSS``: how often the set of primaries
            is compared with the subscribed one (a graceful failover raises no error).
    """

    interval_s: float = 30.0
    jitter_fraction: float = 0.1
    min_idle_s: float = _MIN_IDLE_FLOOR_S
    batch_size: int = 100
    scan_budget_s: float = 0.25
    max_retries: int = 3
    dlq_stream: str | None = None
    dlq_maxlen: int = 10_000
    lease_check_interval_s: float = 1.0
    notification_delay_max_s: float = 0.25
    configure_keyspace_events: bool = True
    topology_check_interval_s: float = 2.0
    keyspace_flags: str = field(default="Kx", repr=False)

    def __post_init__(self) -> None:
        _positive("interval_s", self.interval_s)
        _non_negative("jitter_fraction", self.jitter_fraction)
        if self.jitter_fraction > 1:
            raise ConfigurationError("jitter_fraction", "must be <= 1")
        _positive("min_idle_s", self.min_idle_s)
        _int_at_least("batch_size", self.batch_size, 1)
        _positive("scan_budget_s", self.scan_budget_s)
        _int_at_least("max_retries", self.max_retries, 0)
        if self.dlq_stream is not None and not self.dlq_stream:
            raise ConfigurationError("dlq_stream", "must not be empty")
        _int_at_least("dlq_maxlen", self.dlq_maxlen, 0)
        _positive("lease_check_interval_s", self.lease_check_interval_s)
        _non_negative("notification_delay_max_s", self.notification_delay_max_s)
        _positive("topology_check_interval_s", self.topology_check_interval_s)
        if not isinstance(self.configure_keyspace_events, bool):
            raise ConfigurationError("configure_keyspace_events", "must be a bool")

    def check_against(self, consumer: ConsumerConfig) -> None:
        """Validate the rules that involve both configurations.

        Raises:
            ConfigurationError: ``min_idle_s`` does not exceed ``lock_ttl_s``.
        """
        if self.min_idle_s <= consumer.lock_ttl_s:
            raise ConfigurationError(
                "min_idle_s",
                f"must exceed ConsumerConfig.lock_ttl_s ({consumer.lock_ttl_s}), "
                f"got {self.min_idle_s}",
            )


@dataclass(frozen=True, kw_only=True, slots=True)
class GroupRetention:
    """How a :class:`~streamjobs.GroupConsumer` trims the streams it reads
    (docs/shared-groups.md#retention).

    Every ``interval_s`` each consumer trims each of its streams below its *floor*:
    the oldest entry any consumer group of the stream (its own or another service's)
    has not acknowledged. Trimming is approximate (``XTRIM MINID ~``): whole nodes of
    about 100 entries, never an entry at or above the floor. A reader of the stream
    outside any group (``XREAD``) is not waited for.

    Attributes:
        trim_acknowledged: trim below the floor (the default); False keeps every
            entry unless a cap says otherwise.
        max_len: cap on the stream's length (approximately), None for none. Entries
            the cap removes at or above the floor are counted
            (``streamjobs_group_entries_dropped_total``, a warning): some may not have
            been acknowledged by every group.
        max_age_s: cap on the entries' age (from their ids), None for none; counted
            like ``max_len``.
        interval_s: how often the trim runs (jittered by a quarter).
        batch: the most entries one pass removes per stream and rule.
    """

    trim_acknowledged: bool = True
    max_len: int | None = None
    max_age_s: float | None = None
    interval_s: float = 10.0
    batch: int = 10_000

    def __post_init__(self) -> None:
        if not isinstance(self.trim_acknowledged, bool):
            raise ConfigurationError("trim_acknowledged", "must be a bool")
        if self.max_len is not None:
            _int_at_least("max_len", self.max_len, 1)
        if self.max_age_s is not None:
            _positive("max_age_s", self.max_age_s)
        _positive("interval_s", self.interval_s)
        _int_at_least("batch", self.batch, 1)

    @property
    def active(self) -> bool:
        """Whether there is anything to trim at all."""
        return self.trim_acknowledged or self.max_len is not None or self.max_age_s is not None
