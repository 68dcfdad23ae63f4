"""Producer: queue assignments and append to data streams."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._keys import DEFAULT_PREFIX, Keys
from ._redis import Gateway
from ._wire import EOS_FIELD, EOS_VALUE, build_fields


class Producer:
    """Writes assignments and data entries for one service.

    Args:
        redis: a ``redis.asyncio.Redis`` or ``RedisCluster``; not closed by the producer.
        service: the service whose consumers process the streams.
        key_prefix: must match the consumers' ``ConsumerConfig.key_prefix``.

    Raises:
        ConfigurationError: an invalid service name or prefix.
    """

    def __init__(self, redis: Any, *, service: str, key_prefix: str = DEFAULT_PREFIX) -> None:
        self._keys = Keys(service, key_prefix)
        self._gw = Gateway(redis, self._keys)

    async def add_stream(self, name: str, info: Mapping[str, Any] | None = None) -> str:
        """Queue an assignment naming data stream ``name``; returns the assignment's id.

        Raises:
            InvalidStreamName: ``name`` cannot be given a lock key in its own slot, or is
                reserved (it starts with the key prefix).
            TypeError: ``info`` is not JSON-serialisable.
        """
        self._keys.check_data_stream(name)
        fields = build_fields(name, info)
        # A stream of this name that finished recently still carries its retention
        # TTL, which would expire this job's entries (the new owner clears it too).
        await self._gw.clear_retention(name)
        return await self._gw.add_assignment(fields)

    async def append(self, name: str, fields: Mapping[str, str | bytes | int | float]) -> str:
        """Append one entry to data stream ``name``; returns its id.

        Raises:
            InvalidStreamName: see :meth:`add_stream`.
            ValueError: ``fields`` is empty or uses the reserved ``_eos`` field.
        """
        self._keys.check_data_stream(name)
        if not fields:
            raise ValueError("fields must not be empty")
        if EOS_FIELD in fields:
            raise ValueError(f"{EOS_FIELD!r} is reserved: use close_stream()")
        return await self._gw.append(name, fields)

    async def close_stream(self, name: str) -> str:
        """Append the end-of-stream marker; the owner finishes after it. Returns its id."""
        self._keys.check_data_stream(name)
        return await self._gw.append(name, {EOS_FIELD: EOS_VALUE})
