"""An in-memory Redis client for tests of your own consumers (docs/testing.md)."""

from __future__ import annotations

import functools
import importlib.util
from typing import Any

_INSTALL = "pip install 'streamjobs[testing]'"


def fake_redis(**client_kwargs: Any) -> Any:
    """A new ``redis.asyncio`` client on an empty in-memory server of its own:
    ``fakeredis.FakeAsyncRedis`` with Lua (``streamjobs[testing]``).

    ``Producer``, ``StreamConsumer``, ``Inspector`` and ``DeadLetters`` take it as
    they take a real client, so a unit test can run a produce, consume, retry,
    dead-letter and replay cycle with no server. Two clients from separate calls do
    not share data; to give several objects one server, pass them the same client.

    What it is not: a stand-in for Redis's failure modes. Nothing expires on a
    timer of its own, there are no keyspace notifications (a consumer recovers a dead
    owner's streams through its scanner only) and no cluster; test those against
    :class:`RedisServer` or :class:`LocalCluster`.

    Raises:
        ImportError: fakeredis or its Lua support (lupa) is not installed.
    """
    missing = [m for m in ("fakeredis", "lupa") if importlib.util.find_spec(m) is None]
    if missing:  # lupa: the Lua runtime fakeredis runs scripts with
        raise ImportError(
            f"fake_redis() needs fakeredis with Lua ({', '.join(missing)} missing): {_INSTALL}"
        )
    import fakeredis

    return _client_class()(server=fakeredis.FakeServer(), **client_kwargs)


@functools.cache
def _client_class() -> type:
    import fakeredis

    class InMemoryRedis(fakeredis.FakeAsyncRedis):
        """fakeredis' client, answering the one admin read a consumer makes at start
        that fakeredis lacks: ``INFO memory`` (it never evicts: ``noeviction``)."""

        async def info(self, section: str | None = None, *args: Any, **kwargs: Any) -> Any:
            if section == "memory":
                return {"maxmemory_policy": "noeviction"}
            return await super().info(section, *args, **kwargs)

    return InMemoryRedis
