"""streamjobs: exclusively owned work streams on Redis Streams, with crash recovery.

Subclass :class:`StreamConsumer`, implement ``handle()``, and run it; queue work
with :class:`Producer`. See README.md and docs/.
"""

from __future__ import annotations

from ._deadletter import DeadLetterRecord as DeadLetterRecord
from ._dlq_reason import DeadLetterReason as DeadLetterReason
from ._stats import ConsumerStatistics as ConsumerStatistics
from .config import ClusterMode as ClusterMode
from .config import ConsumerConfig as ConsumerConfig
from .config import GroupRetention as GroupRetention
from .config import Liveness as Liveness
from .config import RecoveryConfig as RecoveryConfig
from .consumer import StreamConsumer as StreamConsumer
from .dlq import DeadLetterFilter as DeadLetterFilter
from .dlq import DeadLetters as DeadLetters
from .exceptions import ClusterNotSettled as ClusterNotSettled
from .exceptions import ConfigurationError as ConfigurationError
from .exceptions import DeadLetter as DeadLetter
from .exceptions import HandlerDirective as HandlerDirective
from .exceptions import HandlerTimeout as HandlerTimeout
from .exceptions import HookFailed as HookFailed
from .exceptions import InvalidAssignment as InvalidAssignment
from .exceptions import InvalidStreamName as InvalidStreamName
from .exceptions import NoSuchGroup as NoSuchGroup
from .exceptions import PermissionDenied as PermissionDenied
from .exceptions import RedisCommandError as RedisCommandError
from .exceptions import RedisUnavailable as RedisUnavailable
from .exceptions import Retry as Retry
from .exceptions import ScriptError as ScriptError
from .exceptions import StreamJobsError as StreamJobsError
from .exceptions import WrongKeyType as WrongKeyType
from .group import GroupConsumer as GroupConsumer
from .inspector import Inspector as Inspector
from .inspector import StreamState as StreamState
from .inspector import UnknownService as UnknownService
from .message import Message as Message
from .metrics import EntryOutcome as EntryOutcome
from .metrics import MetricsRecorder as MetricsRecorder
from .metrics import NullRecorder as NullRecorder
from .metrics import RequeueOutcome as RequeueOutcome
from .metrics import ServiceSample as ServiceSample
from .metrics import StreamEvent as StreamEvent
from .producer import CancelOutcome as CancelOutcome
from .producer import Producer as Producer
from .prometheus import PrometheusRecorder as PrometheusRecorder

__all__ = (
    "CancelOutcome",
    "ClusterMode",
    "ClusterNotSettled",
    "ConfigurationError",
    "ConsumerConfig",
    "ConsumerStatistics",
    "DeadLetter",
    "DeadLetterFilter",
    "DeadLetterReason",
    "DeadLetterRecord",
    "DeadLetters",
    "EntryOutcome",
    "GroupConsumer",
    "GroupRetention",
    "HandlerDirective",
    "HandlerTimeout",
    "HookFailed",
    "Inspector",
    "InvalidAssignment",
    "InvalidStreamName",
    "Liveness",
    "Message",
    "MetricsRecorder",
    "NoSuchGroup",
    "NullRecorder",
    "PermissionDenied",
    "Producer",
    "PrometheusRecorder",
    "RecoveryConfig",
    "RedisCommandError",
    "RedisUnavailable",
    "RequeueOutcome",
    "Retry",
    "ScriptError",
    "ServiceSample",
    "StreamConsumer",
    "StreamEvent",
    "StreamJobsError",
    "StreamState",
    "UnknownService",
    "WrongKeyType",
)

__version__ = "0.1.0"
