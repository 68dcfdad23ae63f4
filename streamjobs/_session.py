"""Session liveness (``Liveness.SESSION``): lock tokens that name a consumer session.

Under ``Liveness.SESSION`` a consumer renews one session key per heartbeat instead of
every lock it holds. Each incarnation of a consumer (one ``run()``) has a random
*incarnation* id, written in its session key's value, and every lock it takes holds a
token naming that incarnation. A lock is alive while the session it names is: its key
exists and still holds that incarnation. A session that expired, or that a restart
under the same consumer name replaced, never comes back: its owner starts a new
incarnation, so a recoverer that read a session dead may replace the locks naming it.
See docs/design.md#liveness.

A token also names its holder's service, because two services under one prefix share
lock keys: the session that decides is the holder's, not the reader's.

Tokens of ``Liveness.LOCK`` consumers (``<consumer>:<random>``) never match the
session form, so a fleet of both kinds recovers each other's streams.
"""

from __future__ import annotations

import json
import re
import secrets
from typing import NamedTuple

# The service sits in braces: a service name has none (``_keys``), so the first ``}``
# ends it whatever the consumer's name holds. Tokens of releases before the service
# was named in them (no braces) read as the reader's own service.
_TOKEN = re.compile(r"~s:([0-9a-f]{16}):[0-9a-f]{16}:(?:\{([^{}]+)\}:)?(.+)", re.DOTALL)


class SessionToken(NamedTuple):
    """What a session-style lock token names."""

    incarnation: str
    consumer: str
    service: str | None
    """The holder's service (whose session keys decide whether it is alive); None in a
    token written before tokens named it: the reader's own service."""


def new_incarnation() -> str:
    return secrets.token_hex(8)


def session_token(incarnation: str, consumer: str, service: str) -> str:
    """A fresh lock token of ``consumer``'s session ``incarnation`` in ``service``.

    Lock keys are shared by the services under one prefix, so the token names the
    holder's service: whoever reads the lock checks the session in that service.
    """
    return f"~s:{incarnation}:{secrets.token_hex(8)}:{{{service}}}:{consumer}"


def parse_session_token(token: str) -> SessionToken | None:
    """What a session-style lock token names; None for a ``Liveness.LOCK`` token."""
    m = _TOKEN.fullmatch(token)
    return None if m is None else SessionToken(m.group(1), m.group(3), m.group(2))


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
