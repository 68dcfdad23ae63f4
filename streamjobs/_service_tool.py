"""The base of the operator's tools (``Inspector``, ``DeadLetters``): one service's
keys and gateway, on a client the caller owns."""

from __future__ import annotations

from typing import Any

from ._keys import DEFAULT_PREFIX, Keys
from ._redis._gateway import Gateway


class ServiceTool:
    """One service's keys and gateway on ``redis`` (the subclasses document the
    arguments). Constructing it does no I/O."""

    def __init__(
        self,
        redis: Any,
        *,
        service: str,
        key_prefix: str = DEFAULT_PREFIX,
        dlq_stream: str | None = None,
    ) -> None:
        keys = Keys(service, key_prefix)
        if dlq_stream is not None:
            keys.check_dlq_name(dlq_stream)
        self._keys = keys
        self._gw = Gateway(redis, keys, dlq=dlq_stream)
