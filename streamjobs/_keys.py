"""Every Redis key name streamjobs uses, and the cluster-slot rules behind them.

No other module builds a key by hand. The rules (docs/design.md#keys):

* The assignment stream (LBS), the dead-letter stream, the lease index, the
  active-assignment index and the idempotency keys of a service share the hash tag
  ``{service}``, so moves between them are single-slot Lua scripts even on a cluster.
  A custom dead-letter stream name must hash to the same slot
  (:meth:`Keys.check_dlq_name`).
* The lock of data stream ``D`` hashes to the same slot as ``D`` itself, so a
  script can check the lock token and touch ``D`` atomically (fenced acks and
  reads). If ``D`` carries a valid hash tag the lock keeps it; otherwise the lock
  wraps the whole name in braces. A name for which neither works (a ``}`` outside
  any valid tag) is rejected.
"""

from __future__ import annotations

from dataclasses import dataclass

from redis.crc import key_slot as _key_slot

from .exceptions import ConfigurationError, InvalidStreamName

DEFAULT_PREFIX = "streamjobs"

# Sub-prefixes of lock keys. They differ in their first character so a tagged
# name and an untagged one can never produce the same lock key (``{x}`` tagged vs
# ``x`` untagged would otherwise both give ``P:lock:{x}``).
_LOCK_TAGGED = ":lock:t:"
_LOCK_WRAPPED = ":lock:{"


def hash_tag(key: str) -> str | None:
    """The hash tag Redis Cluster would use for ``key``, or None if it has none."""
    start = key.find("{")
    if start < 0:
        return None
    end = key.find("}", start + 1)
    if end < 0 or end == start + 1:
        return None
    return key[start + 1 : end]


def key_slot(key: str) -> int:
    """The cluster slot of ``key`` (CRC16 of the hash tag or of the whole key)."""
    return int(_key_slot(key.encode("utf-8")))


def _check_name_part(field: str, value: str) -> None:
    if not value:
        raise ConfigurationError(field, "must not be empty")
    if "{" in value or "}" in value:
        raise ConfigurationError(
            field, "must not contain '{' or '}' (they would break its hash tag)"
        )
    if any(ch.isspace() for ch in value):
        raise ConfigurationError(field, "must not contain whitespace")


@dataclass(frozen=True, slots=True)
class Keys:
    """Key names of one service under one prefix."""

    service: str
    prefix: str = DEFAULT_PREFIX

    def __post_init__(self) -> None:
        _check_name_part("service", self.service)
        _check_name_part("prefix", self.prefix)

    @property
    def assignments(self) -> str:
        """The assignment stream (LBS); its consumer group is named after the service."""
        return f"{self.prefix}:{{{self.service}}}:lbs"

    @property
    def dead_letters(self) -> str:
        """The dead-letter stream; same slot as the LBS."""
        return f"{self.prefix}:{{{self.service}}}:dlq"

    @property
    def leases(self) -> str:
        """Sorted set: assignment id -> server-time lock deadline (ms); same slot as the LBS."""
        return f"{self.prefix}:{{{self.service}}}:leases"

    @property
    def active(self) -> str:
        """Hash: data stream name -> id of its unfinished assignment queued by
        ``Producer.add_stream`` (the index that makes submission idempotent); same slot
        as the LBS."""
        return f"{self.prefix}:{{{self.service}}}:active"

    @property
    def sessions(self) -> str:
        """Sorted set: session index member (``<incarnation>:<consumer>``) -> server-time
        deadline (ms) of consumers under ``Liveness.SESSION``; same slot as the LBS."""
        return f"{self.prefix}:{{{self.service}}}:sessions"

    @property
    def group_streams(self) -> str:
        """Set: every stream a ``GroupConsumer`` of this service joined (what ``status``
        lists); same slot as the LBS."""
        return f"{self.prefix}:{{{self.service}}}:groups"

    @property
    def stopped(self) -> str:
        """Hash: consumer name -> server time (ms) it stopped cleanly, so that ``status``
        tells a stopped consumer from a dead one; same slot as the LBS, kept a day."""
        return f"{self.prefix}:{{{self.service}}}:stopped"

    @property
    def scan_lease(self) -> str:
        """String: the consumer running this interval's reconciliation scan (PX)."""
        return f"{self.prefix}:{{{self.service}}}:scan:lease"

    @property
    def scan_cursor(self) -> str:
        """String: the pending-list id the next scan pass resumes after."""
        return f"{self.prefix}:{{{self.service}}}:scan:cursor"

    @property
    def idempotency_prefix(self) -> str:
        """Start of every idempotency key (:meth:`idempotency`)."""
        return f"{self.prefix}:{{{self.service}}}:idem:"

    def idempotency(self, key: str) -> str:
        """The key recording which assignment a submission with idempotency key ``key``
        made (``Producer.add_stream(..., idempotency_key=key)``); same slot as the LBS,
        whatever ``key`` holds (the service's tag comes first).

        Raises:
            ConfigurationError: for field ``idempotency_key``: not a non-empty str, or
                not encodable as UTF-8.
        """
        if not isinstance(key, str) or not key:
            raise ConfigurationError("idempotency_key", "must be a non-empty str")
        try:
            key.encode("utf-8")
        except UnicodeEncodeError:
            raise ConfigurationError("idempotency_key", "must be valid UTF-8") from None
        return f"{self.idempotency_prefix}{key}"

    def check_dlq_name(self, name: str) -> None:
        """Reject a custom dead-letter stream name (``RecoveryConfig.dlq_stream``).

        Moving an assignment to the dead-letter stream is one script over the LBS, the
        dead-letter stream, the lease index and the active-assignment index, so the
        name must hash to the LBS's cluster slot: give it the hash tag ``{service}`` (as
        in ``P:{service}:dlq``). This holds in every cluster mode, since a standalone
        deployment may become a cluster later. Nor may it be the LBS, one of the
        indexes or an idempotency key.

        Raises:
            ConfigurationError: for field ``dlq_stream``, with the rule.
        """
        if not isinstance(name, str) or not name:
            raise ConfigurationError("dlq_stream", "must be a non-empty str")
        if name in (
            self.assignments,
            self.leases,
            self.sessions,
            self.stopped,
            self.active,
            self.scan_lease,
            self.scan_cursor,
        ) or name.startswith(self.idempotency_prefix):
            raise ConfigurationError(
                "dlq_stream",
                "must not be the assignment stream, the lease or session index, the scan keys, the "
                f"active-assignment index or an idempotency key ({name!r})",
            )
        try:
            slot = key_slot(name)
        except UnicodeEncodeError:
            raise ConfigurationError("dlq_stream", "must be valid UTF-8") from None
        if slot != key_slot(self.assignments):
            raise ConfigurationError(
                "dlq_stream",
                f"must hash to the assignment stream's cluster slot: carry the hash tag "
                f"{{{self.service}}} (e.g. {self.prefix}:{{{self.service}}}:dead), got {name!r}",
            )

    @property
    def group(self) -> str:
        """Consumer group name used on the LBS and on every data stream."""
        return self.service

    @property
    def lock_pattern(self) -> str:
        """Glob matching every lock key under this prefix (for keyspace subscriptions)."""
        return f"{self.prefix}:lock:*"

    def lock(self, stream: str) -> str:
        """The lock key of data stream ``stream``; same cluster slot as ``stream``.

        Raises:
            InvalidStreamName: no co-located lock key exists for this name.
        """
        check_stream_name(stream)
        if hash_tag(stream) is not None:
            return f"{self.prefix}{_LOCK_TAGGED}{stream}"
        return f"{self.prefix}{_LOCK_WRAPPED}{stream}}}"

    def cancel(self, stream: str) -> str:
        """String: the reason ``stream`` was cancelled (``Producer.cancel_stream``),
        read by its owner's fenced reads; same cluster slot as ``stream``.

        Raises:
            InvalidStreamName: no co-located key exists for this name.
        """
        check_stream_name(stream)
        if hash_tag(stream) is not None:
            return f"{self.prefix}:cancel:t:{stream}"
        return f"{self.prefix}:cancel:{{{stream}}}"

    def ended(self, stream: str) -> str:
        """String: the job (its first assignment id) of ``stream`` that this service
        ended early (a cancel, or ``finish()`` before the end marker), kept until the
        next job of that name starts or for a day. Whatever is appended to ``stream``
        meanwhile belongs to that ended job: the next job's start skips it
        (docs/design.md#job-identity). Per service, like the consumer group whose
        position it guards; same cluster slot as ``stream``.

        Raises:
            InvalidStreamName: no co-located key exists for this name.
        """
        check_stream_name(stream)
        if hash_tag(stream) is not None:
            return f"{self.prefix}:ended:t:{self.service}:{stream}"
        return f"{self.prefix}:ended:{self.service}:{{{stream}}}"

    def members(self, stream: str) -> str:
        """Sorted set: the shared-group members (``GroupConsumer`` sessions) of this
        service reading ``stream``, each scored with the server time (ms) until which
        it is alive, or minus the time it stopped (docs/shared-groups.md#sessions);
        same cluster slot as ``stream``.

        Raises:
            InvalidStreamName: no co-located key exists for this name.
        """
        check_stream_name(stream)
        if hash_tag(stream) is not None:
            return f"{self.prefix}:members:t:{self.service}:{stream}"
        return f"{self.prefix}:members:{self.service}:{{{stream}}}"

    def trimmed(self, stream: str) -> str:
        """String with a TTL: a ``GroupConsumer`` of this service trimmed ``stream``
        lately, and the others skip their pass until it expires, so a stream is trimmed
        about once per ``GroupRetention.interval_s`` however many consumers read it
        (docs/shared-groups.md#retention); same cluster slot as ``stream``.

        Raises:
            InvalidStreamName: no co-located key exists for this name.
        """
        check_stream_name(stream)
        if hash_tag(stream) is not None:
            return f"{self.prefix}:trimmed:t:{self.service}:{stream}"
        return f"{self.prefix}:trimmed:{self.service}:{{{stream}}}"

    def starts(self, stream: str) -> str:
        """Hash: entry id -> how often a ``GroupConsumer`` of this service began handling
        that entry of ``stream`` again after a consumer died or stopped without
        acknowledging it (docs/shared-groups.md#crash-loops); same cluster slot as
        ``stream``. A field goes with its entry's acknowledgement.

        Raises:
            InvalidStreamName: no co-located key exists for this name.
        """
        check_stream_name(stream)
        if hash_tag(stream) is not None:
            return f"{self.prefix}:starts:t:{self.service}:{stream}"
        return f"{self.prefix}:starts:{self.service}:{{{stream}}}"

    def dead_marker(self, stream: str, entry_id: str) -> str:
        """String: the id of the dead letter written for entry ``entry_id`` of data
        stream ``stream``, so that a crash between dead-lettering and acking the entry
        does not write a second one when it is handled again; same slot as the
        dead-letter stream (the service's tag comes first, whatever ``stream`` holds)."""
        return f"{self.prefix}:{{{self.service}}}:dead:{entry_id}:{stream}"

    def replayed(self, stream: str, dead_letter_id: str) -> str:
        """String: the id a dead letter's replay appended to data stream ``stream``
        (``DeadLetters.replay`` keeps it a day, so a repeat appends nothing); same
        cluster slot as ``stream``."""
        check_stream_name(stream)
        if hash_tag(stream) is not None:
            return f"{self.prefix}:replayed:t:{dead_letter_id}:{stream}"
        return f"{self.prefix}:replayed:{dead_letter_id}:{{{stream}}}"

    @property
    def session_prefix(self) -> str:
        """Start of every session key (:meth:`session`)."""
        return f"{self.prefix}:{{{self.service}}}:session:"

    def session(self, consumer: str) -> str:
        """String (PX one lock TTL): consumer ``consumer`` of this service is alive,
        renewed by its heartbeat, deleted when it stops; same slot as the LBS."""
        return f"{self.session_prefix}{consumer}"

    def check_data_stream(self, stream: str) -> None:
        """Reject a name that cannot be a data stream of this service.

        Besides :func:`check_stream_name`'s rules, every name under the key prefix
        (``P:...``) is reserved: a data stream named like the assignment stream, the
        dead-letter stream, the lease index or a lock would make its owner consume or
        destroy the framework's own state.

        Raises:
            InvalidStreamName: with the reason.
        """
        check_stream_name(stream)
        if stream.startswith(f"{self.prefix}:"):
            raise InvalidStreamName(
                stream, f"names starting with {self.prefix + ':'!r} are reserved for streamjobs"
            )

    def stream_of_lock(self, lock_key: str) -> str | None:
        """Inverse of :meth:`lock`; None if ``lock_key`` is not one of ours."""
        tagged = f"{self.prefix}{_LOCK_TAGGED}"
        wrapped = f"{self.prefix}{_LOCK_WRAPPED}"
        if lock_key.startswith(tagged):
            return lock_key[len(tagged) :]
        if lock_key.startswith(wrapped) and lock_key.endswith("}"):
            return lock_key[len(wrapped) : -1]
        return None


MAX_STREAM_NAME_BYTES = 1024
"""Longest data stream name: names appear in keys, dead letters and log lines."""


def check_stream_name(stream: str) -> None:
    """Reject a data stream name that cannot get a lock key in its own slot.

    Raises:
        InvalidStreamName: with the reason.
    """
    if not isinstance(stream, str):
        raise InvalidStreamName(repr(stream), "must be a str")
    if not stream:
        raise InvalidStreamName(stream, "must not be empty")
    try:
        size = len(stream.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidStreamName(stream, "is not valid UTF-8") from None
    if size > MAX_STREAM_NAME_BYTES:
        raise InvalidStreamName(
            stream, f"is {size} bytes long; the most is {MAX_STREAM_NAME_BYTES}"
        )
    if hash_tag(stream) is None and "}" in stream:
        # Wrapping the name in braces would end the lock's tag at this '}', so the
        # lock would hash elsewhere than the stream.
        raise InvalidStreamName(stream, "contains '}' outside a valid {hash tag}")
