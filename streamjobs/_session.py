"""Session liveness (``Liveness.SESSION``): lock tokens that name a consumer session.

Under ``Liveness.SESSION`` a consumer renews one session key per heartbeat instead of
every lock it holds. Each incarnation of a consumer (one ``run()``) has a random
*incarnation* id, written in its session key's value, and every lock it takes holds a
token naming that incarnation. A lock is alive while the session it names is: its key
exists and still holds that incarnation. A session that expired, or that a restart
under the same consumer name replaced, never comes back: its owner starts a new
incarnation, so a recoverer that read a session dead may replace the locks naming it.
See docs/design.md#liveness.

Tokens of ``Liveness.LOCK`` consumers (``<consumer>:<random>``) never match the
session form, so a fleet of both kinds recovers each other's streams.
"""

from __future__ import annotations

import json
import re
import secrets

_TOKEN = re.compile(r"~s:([0-9a-f]{16}):[0-9a-f]{16}:(.+)", re.DOTALL)


def new_incarnation() -> str:
    return secrets.token_hex(8)


def session_token(incarnation: str, consumer: str) -> str:
    """A fresh lock token of ``consumer``'s session ``incarnation``."""
    return f"~s:{incarnation}:{secrets.token_hex(8)}:{consumer}"


def parse_session_token(token: str) -> tuple[str, str] | None:
    """``(incarnation, consumer)`` of a session-style lock token; None for a lock token."""
    m = _TOKEN.fullmatch(token)
    return None if m is None else (m.group(1), m.group(2))


def member(incarnation: str, consumer: str) -> str:
    """The session index's member for one incarnation of ``consumer``."""
    return f"{incarnation}:{consumer}"


def parse_member(value: str) -> tuple[str, str] | None:
    """``(incarnation, consumer)`` of a session index member; None if malformed."""
    incarnation, sep, consumer = value.partition(":")
    if not sep or not consumer or len(incarnation) != 16:
        return None
    return incarnation, consumer


def incarnation_of(value: str | None) -> str | None:
    """The incarnation a session key's value holds (None: none, or not JSON)."""
    if value is None:
        return None
    try:
        data = json.loads(value)
    except ValueError:
        return None
    found = data.get("incarnation") if isinstance(data, dict) else None
    return found if isinstance(found, str) else None
