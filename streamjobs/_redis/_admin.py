"""Administrative commands on any client (``CONFIG``, ``CLUSTER INFO/SLOTS``, the
client's database) and the blocking reader of idle streams."""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import Mapping, Sequence
from typing import Any

import anyio
from redis import exceptions as rex

from ._boundary import (
    SlotMap,
    translated,
)
from ._replies import (
    text,
)


class BlockingReader:
    """One connection of the client's pool, held for multi-key ``XREAD BLOCK`` calls.

    Standalone clients only (a cluster refuses keys of several slots in one command).
    Its ``CLIENT ID`` lets another connection end a read early (``CLIENT UNBLOCK``).
    """

    def __init__(self, client: Any) -> None:
        self._pool = client.connection_pool
        self._connection: Any = None
        self.client_id: int | None = None

    @translated
    async def open(self) -> None:
        try:
            self._connection = await self._pool.get_connection()
        except TypeError:  # redis-py before 5.3 wants a command name
            self._connection = await self._pool.get_connection("XREAD")
        await self._connection.send_command("CLIENT", "ID")
        self.client_id = int(await self._connection.read_response())

    @translated
    async def read(self, after: Mapping[str, str], block_ms: int) -> list[str]:
        """Block until one of ``after``'s streams has an entry newer than its id, or
        ``block_ms`` pass, or ``CLIENT UNBLOCK``; returns the streams that have one."""
        connection = self._connection
        assert connection is not None, "open() first"
        await connection.send_command(
            "XREAD", "COUNT", 1, "BLOCK", block_ms, "STREAMS", *after.keys(), *after.values()
        )
        reply = await connection.read_response()
        if isinstance(reply, dict):  # RESP3
            return [text(name) for name in reply]
        return [text(item[0]) for item in reply or ()]

    @translated
    async def missing(self, keys: Sequence[str]) -> list[str]:
        """Those of ``keys`` that do not exist: one ``EXISTS`` over all of them, and
        only if some are gone, one per key (pipelined) to say which."""
        connection = self._connection
        assert connection is not None, "open() first"
        if not keys:
            return []
        await connection.send_command("EXISTS", *keys)
        if int(await connection.read_response()) == len(keys):
            return []
        await connection.send_packed_command(
            connection.pack_commands([("EXISTS", key) for key in keys])
        )
        found = [int(await connection.read_response()) for _ in keys]
        return [key for key, n in zip(keys, found, strict=True) if n == 0]

    async def close(self) -> None:
        connection, self._connection, self.client_id = self._connection, None, None
        if connection is not None:
            with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
                await connection.disconnect()  # a read may be in flight: never reuse it
                await self._pool.release(connection)


def is_tls_failure(exc: BaseException) -> bool:
    """True if ``exc``, or what it was raised from, is a handshake error or a timeout;
    False if a server answered (a wrong password is no TLS problem)."""
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in chain:
        chain.append(current)
        current = current.__cause__ or current.__context__
    if any(isinstance(e, rex.AuthenticationError | rex.ResponseError) for e in chain):
        return False
    return any(
        isinstance(e, ssl.SSLError | TimeoutError | rex.TimeoutError)
        or (isinstance(e, rex.ConnectionError) and "SSL" in str(e))
        for e in chain
    )


# -- administrative commands on any client -------------------------------------------


@translated
async def ping(client: Any) -> None:
    await client.ping()


@translated
async def get_config(client: Any, name: str) -> str:
    """``CONFIG GET name`` ('' if unset)."""
    reply = await client.config_get(name)
    return text(reply.get(name, "") or "")


@translated
async def eviction_policies(client: Any) -> list[str]:
    """``maxmemory_policy`` from ``INFO memory`` (allowed where CONFIG is not), of
    the server, or of every primary of a cluster."""
    if hasattr(client, "get_primaries"):
        reply = await client.info("memory", target_nodes=client.PRIMARIES)
        infos = list(reply.values()) if isinstance(reply, dict) else [reply]
        if infos and not isinstance(infos[0], dict):  # one node answered, unwrapped
            infos = [reply]
    else:
        infos = [await client.info("memory")]
    return [text(info.get("maxmemory_policy", "")) for info in infos if isinstance(info, dict)]


@translated
async def set_config(client: Any, name: str, value: str) -> None:
    await client.config_set(name, value)


def parse_slots(reply: Any) -> SlotMap:
    """CLUSTER SLOTS in either redis-py shape (raw list, or parsed dict)."""
    out: SlotMap = {}
    if isinstance(reply, dict):
        for (lo, hi), info in reply.items():
            host, port = info["primary"][:2]
            out[(int(lo), int(hi))] = (text(host), int(port))
        return out
    for item in reply or ():
        lo, hi, primary = item[0], item[1], item[2]
        out[(int(lo), int(hi))] = (text(primary[0]), int(primary[1]))
    return out


@translated
async def cluster_state(node: Any) -> tuple[str, SlotMap]:
    """``cluster_state`` and the slot map, as one node sees them (pure reads)."""
    info = await node.execute_command("CLUSTER INFO")
    slots = await node.execute_command("CLUSTER SLOTS")
    state = info.get("cluster_state") if isinstance(info, dict) else None
    if state is None:
        state = "ok" if "cluster_state:ok" in text(info) else "fail"
    return text(state), parse_slots(slots)


def client_db(client: Any) -> int:
    """The database number a client talks to (a cluster client's ``db`` too, 0 if it
    has none)."""
    pool = getattr(client, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", None) or getattr(client, "connection_kwargs", {})
    return int((kwargs or {}).get("db", 0) or 0)
