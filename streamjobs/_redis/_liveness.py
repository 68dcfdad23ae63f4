"""Whether a holder is alive: lock state, sessions, the sweeps, the scan lease."""

from __future__ import annotations

import time
from typing import Any

from .._keys import Keys
from .._session import incarnation_of, parse_session_token
from .._session import member as session_member
from .._wire import (
    is_eos,
)
from ._boundary import (
    _CURSOR_KEEP_MS,
    Core,
    channelled_command,
    script,
    translated,
)
from ._protocol import (
    SessionMode,
)
from ._replies import (
    sized_entries,
    text,
)
from ._scripts import Scripts

STOPPED_KEEP_MS = 24 * 3600 * 1000
"""How long the record of consumers that stopped cleanly is kept after the last stop."""


class LivenessCommands:
    """Whether a holder is alive: lock state, sessions, the sweeps, the scan lease."""

    def __init__(self, core: Core) -> None:
        self.core = core
        self.client: Any = core.client
        self.keys: Keys = core.keys
        self.scripts: Scripts = core.scripts

    @channelled_command
    async def is_end_marker(self, stream: str, entry_id: str) -> bool:
        """True if entry ``entry_id`` of ``stream`` is the end-of-stream marker."""
        reply = await self.core.command(stream, "XRANGE", stream, entry_id, entry_id, "COUNT", 1)
        entries, _ = sized_entries(reply)
        return bool(entries) and is_eos(entries[0][1])

    @translated
    async def lock_exists(self, stream: str) -> bool:
        return int(await self.client.exists(self.keys.lock(stream))) == 1

    async def lock_alive(self, stream: str) -> bool:
        """Whether ``stream``'s lock exists and, if it names a session, that session is
        alive (two reads: the lock is in the stream's slot, the session in the
        service's). A dead session never comes back, so False stays true."""
        return (await self.lock_state(stream))[0]

    async def lock_state(self, stream: str) -> tuple[bool, str | None]:
        """``(alive, dead token)``: whether the lock is alive (:meth:`lock_alive`), and
        the token of a lock that exists but names a dead session (else None)."""
        holder = await self.lock_holder(stream)
        if holder is None:
            return False, None
        parsed = parse_session_token(holder)
        if parsed is None:
            return True, None
        if await self.session_alive(parsed.consumer, parsed.incarnation, parsed.service):
            return True, None
        return False, holder

    @translated
    async def session_alive(
        self, consumer: str, incarnation: str, service: str | None = None
    ) -> bool:
        """Whether ``consumer``'s session key exists and holds ``incarnation``.

        ``service`` is the consumer's service when it is not this gateway's (a lock
        token of another service under the same prefix names its own).
        """
        keys = self.keys
        if service is not None and service != keys.service:
            keys = Keys(service, keys.prefix)
        value = await self.client.get(keys.session(consumer))
        return incarnation_of(None if value is None else text(value)) == incarnation

    @script
    async def session(
        self, mode: SessionMode, consumer: str, value: str, ttl_ms: int, incarnation: str
    ) -> bool:
        """session.lua: create, renew, end or forget one incarnation of ``consumer``'s
        session (``value`` is the incarnation itself for 'forget')."""
        keys = self.keys
        r = await self.scripts.session(
            keys=[keys.session(consumer), keys.sessions, keys.assignments],
            args=[mode, value, ttl_ms, session_member(incarnation, consumer), keys.group, consumer],
        )
        return int(r) == 1

    @script
    async def next_due_ms(self) -> int | None:
        """Milliseconds (server time) until the earliest lease or session deadline; 0 if
        one has passed; None if there is none."""
        r = int(await self.scripts.next_due(keys=[self.keys.leases, self.keys.sessions]))
        return None if r < 0 else r

    @script
    async def sweep_sessions(self, limit: int, recheck_ms: int) -> list[tuple[str, int]]:
        """Claim due session index members: (member, its deadline in server ms) each."""
        r = await self.scripts.sweep(keys=[self.keys.sessions], args=[0, limit, recheck_ms])
        return [(text(r[i]), int(float(text(r[i + 1])))) for i in range(0, len(r), 2)]

    @channelled_command
    async def lock_and_cancel(self, stream: str) -> tuple[str | None, str | None]:
        """The token in ``stream``'s lock and the reason in its cancel marker (None where
        there is none): one MGET, both keys being in the stream's slot."""
        lock = self.keys.lock(stream)
        token, reason = await self.core.command(lock, "MGET", lock, self.keys.cancel(stream))
        return (None if token is None else text(token), None if reason is None else text(reason))

    @channelled_command
    async def lock_and_ended(self, stream: str) -> tuple[str | None, str | None]:
        """The token in ``stream``'s lock and the job its ended-job marker names (None
        where there is none): one MGET, both keys being in the stream's slot."""
        lock = self.keys.lock(stream)
        token, ended = await self.core.command(lock, "MGET", lock, self.keys.ended(stream))
        job = None if ended is None else text(ended).partition(" ")[2]
        return (None if token is None else text(token), job)

    @channelled_command
    async def lock_holder(self, stream: str) -> str | None:
        """The token in ``stream``'s lock, or None if there is no lock."""
        lock = self.keys.lock(stream)
        token = await self.core.command(lock, "GET", lock)
        return None if token is None else text(token)

    @script
    async def sweep_leases(
        self, horizon_ms: int, limit: int, recheck_ms: int
    ) -> list[tuple[str, int]]:
        """Claim due leases: (assignment id, its deadline in server ms) each."""
        r = await self.scripts.sweep(keys=[self.keys.leases], args=[horizon_ms, limit, recheck_ms])
        return [(text(r[i]), int(float(text(r[i + 1])))) for i in range(0, len(r), 2)]

    @script
    async def prune_consumers(self, min_idle_ms: int, keep: str) -> list[str]:
        """Delete assignment-group consumers with nothing pending, idle ``min_idle_ms``."""
        r = await self.scripts.prune_consumers(
            keys=[self.keys.assignments],
            args=[self.keys.group, min_idle_ms, keep, self.keys.session_prefix],
        )
        return [text(name) for name in r]

    @translated
    async def touch_session(self, consumer: str, value: str, ttl_ms: int) -> None:
        """Mark ``consumer`` alive for ``ttl_ms`` (its heartbeat renews it)."""
        await self.client.set(self.keys.session(consumer), value, px=ttl_ms)

    @translated
    async def end_session(self, consumer: str) -> None:
        """``consumer`` stopped: its name may be pruned at once."""
        await self.client.delete(self.keys.session(consumer))

    @translated
    async def record_stop(self, consumer: str, stopped: bool) -> None:
        """Record that ``consumer`` stopped cleanly (``stopped``), or forget it (it is
        starting): what ``status`` shows as ``stopped`` rather than ``dead``. The
        record is kept :data:`STOPPED_KEEP_MS`; it is for operators only."""
        key = self.keys.stopped
        if not stopped:
            await self.client.hdel(key, consumer)
            return
        now_ms = int(time.time() * 1000)
        async with self.client.pipeline(transaction=not self.core.is_cluster) as pipe:
            pipe.hset(key, consumer, now_ms)
            pipe.pexpire(key, STOPPED_KEEP_MS)
            await pipe.execute()

    @translated
    async def unblock(self, client_id: int) -> bool:
        """CLIENT UNBLOCK: end the blocking read of connection ``client_id`` now."""
        return int(await self.client.execute_command("CLIENT", "UNBLOCK", client_id)) == 1

    @translated
    async def take_scan_lease(self, owner: str, ttl_ms: int) -> bool:
        """SET NX PX: True if ``owner`` runs the reconciliation scan for ``ttl_ms``."""
        return bool(await self.client.set(self.keys.scan_lease, owner, nx=True, px=ttl_ms))

    @translated
    async def scan_cursor(self) -> str:
        """Where the next scan pass starts in the pending list ('-': the beginning)."""
        cursor = await self.client.get(self.keys.scan_cursor)
        return "-" if cursor is None else text(cursor)

    @translated
    async def save_scan_cursor(self, cursor: str) -> None:
        # Kept a day: a service that stops for longer starts its next round afresh.
        await self.client.set(self.keys.scan_cursor, cursor, px=_CURSOR_KEEP_MS)
