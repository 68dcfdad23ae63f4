"""The Redis boundary: every command streamjobs issues, and error translation.

Three kinds of connection, each with one owner:

* commands on the client the user passed in (assignment stream, locks, data
  streams, dead letters, lease index, producer writes): :class:`Gateway`, whose
  command groups are one module each (``_writes``, ``_assignments``, ``_streams``,
  ``_completion``, ``_liveness``) over a shared core (``_boundary``: translation,
  decorators, the raw transaction), whose replies ``_replies`` decodes;
* administrative commands on any client, including a plain client pinned to one
  cluster node (``CONFIG GET/SET notify-keyspace-events``, ``CLUSTER INFO/SLOTS``):
  ``_admin``;
* pub/sub connections (``PSUBSCRIBE`` to keyspace events): ``_notifications``,
  which opens them on the per-node clients it makes.

redis-py errors are translated here and nowhere else. Callers get
:class:`~streamjobs.RedisUnavailable` for anything transient (connection refused or
reset, timeouts, LOADING, CLUSTERDOWN, TRYAGAIN, a failover's UNBLOCKED or
READONLY) and a :class:`~streamjobs.RedisCommandError` for an error reply that
retrying will not fix, classified into :class:`~streamjobs.NoSuchGroup`,
:class:`~streamjobs.WrongKeyType` and (inside our scripts)
:class:`~streamjobs.ScriptError`, of which :class:`EntryTooLarge` is the one a caller
acts on. Nobody outside this package looks at message text.
"""

from ._admin import (
    BlockingReader,
    client_db,
    cluster_state,
    eviction_policies,
    get_config,
    is_tls_failure,
    ping,
    set_config,
)
from ._boundary import (
    ACQUIRED,
    ACQUIRED_ENDED,
    ENDED_MARKER_TTL_MS,
    NOT_ACQUIRED,
    REDIS_FAILURES,
    Addr,
    EntryTooLarge,
    LostAt,
    SlotMap,
    UnexpectedClientError,
    script,
    translate,
    translated,
)
from ._channel import Channel
from ._gateway import Gateway
from ._protocol import Pending, SessionMode, StreamGateway
from ._replies import (
    DataEntry,
    Entry,
    RawFields,
    ReadReply,
    _stream_entries,
    id_order,
    raw,
    sized_entries,
    text,
    text_fields,
)

__all__ = [
    "ACQUIRED",
    "ACQUIRED_ENDED",
    "ENDED_MARKER_TTL_MS",
    "NOT_ACQUIRED",
    "REDIS_FAILURES",
    "Addr",
    "BlockingReader",
    "Channel",
    "DataEntry",
    "Entry",
    "EntryTooLarge",
    "Gateway",
    "LostAt",
    "Pending",
    "RawFields",
    "ReadReply",
    "SessionMode",
    "SlotMap",
    "StreamGateway",
    "UnexpectedClientError",
    "_stream_entries",
    "client_db",
    "cluster_state",
    "eviction_policies",
    "get_config",
    "id_order",
    "is_tls_failure",
    "ping",
    "raw",
    "script",
    "set_config",
    "sized_entries",
    "text",
    "text_fields",
    "translate",
    "translated",
]
