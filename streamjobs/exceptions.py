"""Exceptions raised by streamjobs.

Every exception the library raises derives from one root. redis-py errors are
translated at one boundary (``streamjobs._redis``) and chained with
``raise ... from``.

::

    StreamJobsError
    ├── ConfigurationError        bad configuration value (names the field and the rule)
    ├── InvalidStreamName         a data stream name with no co-located lock key
    ├── InvalidAssignment         an assignment entry that cannot be parsed
    ├── RedisUnavailable          connection refused/reset, timeout, server loading
    │   └── UnexpectedClientError the client failed inside (logged with its traceback)
    ├── RedisCommandError         Redis answered with an error that retrying will not fix
    │   ├── NoSuchGroup           NOGROUP: the stream or its consumer group is gone
    │   ├── WrongKeyType          WRONGTYPE: a key holds another kind of value
    │   └── ScriptError           a streamjobs Lua script raised an error
    │       └── EntryTooLarge     an assignment too large for a script to copy
    ├── ClusterNotSettled         reset_topology() found the cluster mid-change
    ├── HookFailed                on_startup() or on_shutdown() raised
    ├── HandlerTimeout            handle() ran past ConsumerConfig.handler_timeout_s
    └── HandlerDirective          raised by handle() to steer what happens to an entry
        ├── Retry                 retry this entry after delay_s
        └── DeadLetter            send this entry to the dead-letter stream now
"""

from __future__ import annotations


class StreamJobsError(Exception):
    """Root of every exception raised by streamjobs."""


class ConfigurationError(StreamJobsError, ValueError):
    """A configuration value breaks a rule.

    Attributes:
        field: the offending field.
        rule: what the value must satisfy.
    """

    def __init__(self, field: str, rule: str) -> None:
        super().__init__(f"{field}: {rule}")
        self.field = field
        self.rule = rule


MESSAGE_MAX_CHARS = 500
"""Longest message of an exception that quotes input: log lines stay bounded."""


def bounded(text: str, limit: int = MESSAGE_MAX_CHARS) -> str:
    """``text``, cut to ``limit`` characters with the original length noted."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}...({len(text)} chars)"


class InvalidStreamName(StreamJobsError, ValueError):
    """A data stream name for which no lock key in the same cluster slot exists."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"invalid stream name {bounded(repr(name), 200)}: {reason}")
        self.name = name
        self.reason = reason


class InvalidAssignment(StreamJobsError, ValueError):
    """An assignment entry that cannot be parsed. Its message quotes at most
    ``MESSAGE_MAX_CHARS`` characters, whatever the entry holds."""

    def __init__(self, message: str) -> None:
        super().__init__(bounded(message))


class RedisUnavailable(StreamJobsError, ConnectionError):
    """Redis could not be reached (connection error, timeout, loading, failover)."""


class UnexpectedClientError(RedisUnavailable):
    """The client raised something that is not a Redis error while running a command.

    Seen in practice: ``AttributeError`` from inside redis-py when a connection is torn
    down under load during a failover. Treated as transient (the command may or may
    not have run, exactly as with a lost connection), but logged with its traceback.
    """


class RedisCommandError(StreamJobsError):
    """Redis answered a command with an error that retrying will not fix.

    The subclasses name the errors streamjobs acts on; callers match on the type,
    never on the message text (the boundary in ``streamjobs._redis`` classifies).
    """


class NoSuchGroup(RedisCommandError):
    """NOGROUP: the stream or its consumer group does not exist (deleted under us)."""


class WrongKeyType(RedisCommandError):
    """WRONGTYPE: a key streamjobs uses holds another kind of value."""


class PermissionDenied(RedisCommandError):
    """Redis refused a command or key for lack of permission (an ACL ``NOPERM``); the
    message names what was refused. See docs/operations.md#least-privilege-acl."""


class ScriptError(RedisCommandError):
    """A streamjobs Lua script failed while running (Redis does not roll it back)."""


class EntryTooLarge(ScriptError):
    """TOOLARGE: ``requeue.lua`` refused to copy an assignment with more fields than
    one XADD in a script can carry (``_redis._scripts.MAX_COPY_VALUES``). Nothing was
    written: the assignment is still pending, and recovery dead-letters it as
    ``too_large``."""


class ClusterNotSettled(StreamJobsError):
    """The cluster is failing over or resharding; nothing was changed."""


class HookFailed(StreamJobsError):
    """A lifecycle hook (``on_startup`` or ``on_shutdown``) raised; the exception it
    raised is the ``__cause__``.

    Attributes:
        hook: the hook's name.
    """

    def __init__(self, hook: str, error: BaseException) -> None:
        super().__init__(f"{hook}() raised {type(error).__name__}: {bounded(str(error))}")
        self.hook = hook


class HandlerTimeout(StreamJobsError, TimeoutError):
    """``handle()`` did not return within ``handler_timeout_s``; the call was cancelled
    and counts as a failed attempt (retried, then dead-lettered)."""


class HandlerDirective(StreamJobsError):
    """Base of the exceptions a handler raises on purpose to steer processing."""


class Retry(HandlerDirective):
    """Retry the current entry after ``delay_s`` seconds (counts as an attempt)."""

    def __init__(self, delay_s: float = 0.0) -> None:
        if delay_s < 0:
            raise ConfigurationError("delay_s", "must be >= 0")
        super().__init__(f"retry in {delay_s}s")
        self.delay_s = delay_s


class DeadLetter(HandlerDirective):
    """Send the current entry to the dead-letter stream now, without further attempts."""

    def __init__(self, reason: str = "dead-lettered by handler") -> None:
        super().__init__(reason)
        self.reason = reason
