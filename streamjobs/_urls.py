"""Redis URLs: checked before use, and never printed with their secrets.

Every place streamjobs shows a URL (CLI errors, the demo's banner, logs) shows
:func:`redact`'s form. A URL can reach the CLI without appearing in ``ps``: from the
``STREAMJOBS_REDIS_URL`` environment variable or a file (docs/operations.md).
"""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

ENV_VAR = "STREAMJOBS_REDIS_URL"
"""The environment variable the CLI reads the Redis URL from."""

SCHEMES = ("redis", "rediss", "unix")
_SECRET_PARAMS = frozenset({"password"})
_MASK = "***"


class BadRedisURL(ValueError):
    """A URL redis-py would misread or reject; the message names what is wrong."""


def redact(url: str) -> str:
    """``url`` with its password (in the user part or a ``password`` parameter) masked.

    Anything unparseable is masked whole after the scheme, rather than risk a leak.
    """
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if "@" in netloc:
            userinfo, _, hostport = netloc.rpartition("@")
            user, sep, _password = userinfo.partition(":")
            netloc = f"{user}:{_MASK}@{hostport}" if sep else f"{_MASK}@{hostport}"
            if not sep and not user:
                netloc = hostport
        query = parts.query
        if query:
            pairs = parse_qsl(query, keep_blank_values=True)
            query = urlencode(
                [(k, _MASK if k.lower() in _SECRET_PARAMS else v) for k, v in pairs], safe="*"
            )
        if netloc == parts.netloc and query == parts.query:
            return url
        return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    except ValueError:
        scheme, sep, _ = url.partition("://")
        return f"{scheme}://{_MASK}" if sep else _MASK


def scrub(message: str, url: str) -> str:
    """``message`` with every secret of ``url`` (its password, its password parameter)
    replaced by ``***``: for error texts that might quote them."""
    secrets: list[str] = []
    try:
        parts = urlsplit(url)
        if parts.password:
            secrets.append(parts.password)
        secrets += [v for k, v in parse_qsl(parts.query) if k.lower() in _SECRET_PARAMS and v]
    except ValueError:
        return message
    for secret in secrets:
        message = message.replace(secret, _MASK)
    return message


def check(url: str) -> str:
    """``url`` if redis-py will read it as meant; else :class:`BadRedisURL`.

    Checked: the scheme, a host for TCP URLs, a numeric port, and a database that is a
    non-negative integer (redis-py silently takes ``/notadb`` as database 0).
    """
    shown = redact(url)
    if "://" not in url:
        raise BadRedisURL(
            f"{shown!r} is not a URL: write redis://HOST:PORT/DB (rediss:// for TLS, "
            "unix:///path/to/socket)"
        )
    parts = urlsplit(url)
    if parts.scheme not in SCHEMES:
        raise BadRedisURL(f"{shown!r} has scheme {parts.scheme!r}: use one of {', '.join(SCHEMES)}")
    if parts.scheme == "unix":
        if not parts.path:
            raise BadRedisURL(f"{shown!r} names no socket path")
        db = dict(parse_qsl(parts.query)).get("db", "0")
    else:
        if not parts.hostname:
            raise BadRedisURL(f"{shown!r} names no host")
        try:
            parts.port  # noqa: B018 - raises on a non-numeric or out-of-range port
        except ValueError:
            raise BadRedisURL(f"{shown!r} has an invalid port") from None
        path = parts.path.strip("/")
        db = path or dict(parse_qsl(parts.query)).get("db", "0")
    if not db.isdigit():
        raise BadRedisURL(f"{shown!r} selects database {db!r}: it must be a non-negative integer")
    return url
