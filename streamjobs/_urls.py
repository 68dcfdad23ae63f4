"""Redis URLs: checked before use, and never printed with their secrets.

Every place streamjobs shows a URL (CLI errors, the demo's banner, logs) shows
:func:`redact`'s form. A URL can reach the CLI without appearing in ``ps``: from the
``STREAMJOBS_REDIS_URL`` environment variable or a file (docs/operations.md).
"""

from __future__ import annotations

import re
from urllib.parse import SplitResult, parse_qsl, unquote, unquote_plus, urlsplit

ENV_VAR = "STREAMJOBS_REDIS_URL"
"""The environment variable the CLI reads the Redis URL from."""

SCHEMES = ("redis", "rediss", "unix")
_MASK = "***"
_PASSWORD_PARAM = re.compile(r"([?&;]password=)([^&;#]*)", re.IGNORECASE)
"""A ``password`` query parameter (redis-py reads one as the password)."""


class BadRedisURL(ValueError):
    """A URL redis-py would misread or reject; the message names what is wrong."""


def _split_userinfo(url: str) -> tuple[str, str, str] | None:
    """``(prefix, userinfo, rest)`` of ``url`` around its user part, or None if it has none.

    ``prefix`` is ``scheme://`` (empty for a string that is not a URL). When the parsed
    authority holds no ``@`` but the text after it does (a password with an unescaped
    ``/``, ``?`` or ``#``, which redis-py misreads too), everything up to the last ``@``
    counts as the user part: better to mask too much than to print a password.
    """
    scheme, sep, after = url.partition("://")
    prefix = f"{scheme}{sep}" if sep else ""
    body = after if sep else url
    if "@" not in body:
        return None
    try:
        netloc = urlsplit(url).netloc if sep else ""
    except ValueError:
        netloc = ""
    if "@" in netloc:
        userinfo, _, hostport = netloc.rpartition("@")
        return prefix, userinfo, body[len(netloc) - len(hostport) :]
    userinfo, _, rest = body.rpartition("@")
    return prefix, userinfo, rest


def _mask_userinfo(userinfo: str) -> str:
    """``user:***`` (``user:`` for an empty password), or ``***`` for a user part
    that is not ``user:password`` (it may hold a password, unsure where)."""
    user, sep, password = userinfo.partition(":")
    if sep and not any(c in user for c in "/?#"):
        return f"{user}:{_MASK}" if password else f"{user}:"
    return _MASK if userinfo else ""


def redact(url: str) -> str:
    """``url`` with its password (in the user part or a ``password`` parameter) masked.

    The host, port, database and other parameters stay as they were. A user part
    that cannot be told apart from the rest (an unescaped ``/``, ``?`` or ``#`` in the
    password) is masked whole, rather than risk a leak.
    """
    split = _split_userinfo(url)
    if split is None:
        return _PASSWORD_PARAM.sub(rf"\g<1>{_MASK}", url)
    prefix, userinfo, rest = split
    masked = _mask_userinfo(userinfo)
    rest = _PASSWORD_PARAM.sub(rf"\g<1>{_MASK}", rest)
    return f"{prefix}{masked}@{rest}" if masked else f"{prefix}{rest}"


def _secrets(url: str) -> list[str]:
    """What :func:`redact` masks in ``url``, as written and percent-decoded."""
    found: list[str] = []
    split = _split_userinfo(url)
    if split is not None:
        user, sep, password = split[1].partition(":")
        masks_all = not sep or any(c in user for c in "/?#")
        found.append(split[1] if masks_all else password)
    found += [m.group(2) for m in _PASSWORD_PARAM.finditer(url)]
    out: list[str] = []
    for secret in found:
        for form in (secret, unquote(secret), unquote_plus(secret)):
            if form and form not in out:
                out.append(form)
    return sorted(out, key=len, reverse=True)


def scrub(message: str, url: str) -> str:
    """``message`` with every secret of ``url`` (its password, its password parameter,
    as written or decoded) replaced by ``***``: for error texts that might quote them."""
    for secret in _secrets(url):
        message = message.replace(secret, _MASK)
    return message


def check(url: str) -> str:
    """``url`` if redis-py will read it as meant; else :class:`BadRedisURL`.

    Checked: the scheme, a host for TCP URLs, a numeric port, a database (the path or
    ``?db=``) that is a non-negative integer (redis-py silently takes ``/notadb`` as
    database 0), and no ``@`` past the host (a password with an unescaped ``/``, ``?``
    or ``#``, whose tail redis-py would take for the host). Messages show the URL
    redacted.
    """
    shown = redact(url)
    if "://" not in url:
        raise BadRedisURL(
            f"{shown!r} is not a URL: write redis://HOST:PORT/DB (rediss:// for TLS, "
            "unix:///path/to/socket)"
        )
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # an unbalanced [ of an IPv6 address, say
        raise BadRedisURL(f"{shown!r} cannot be parsed: {exc}") from None
    if parts.scheme not in SCHEMES:
        raise BadRedisURL(f"{shown!r} has scheme {parts.scheme!r}: use one of {', '.join(SCHEMES)}")
    if "@" not in parts.netloc and _misplaced_at(parts):
        raise BadRedisURL(
            f"{shown!r} has an '@' after its host: percent-encode '/', '?', '#' and '@' in "
            "a user name or password (%2F, %3F, %23, %40)"
        )
    path_db = ""
    if parts.scheme == "unix":
        if not parts.path:
            raise BadRedisURL(f"{shown!r} names no socket path")
    else:
        if not parts.hostname:
            raise BadRedisURL(f"{shown!r} names no host")
        try:
            parts.port  # noqa: B018 - raises on a non-numeric or out-of-range port
        except ValueError:
            raise BadRedisURL(f"{shown!r} has an invalid port") from None
        path_db = parts.path.strip("/")
    # redis-py takes ?db= first and ignores a path it cannot read: both must be numbers.
    query_db = [v for k, v in parse_qsl(parts.query, keep_blank_values=True) if k == "db"]
    for db in ([path_db] if path_db else []) + query_db:
        _check_db(shown, db)
    return url


def _misplaced_at(parts: SplitResult) -> bool:
    """True if an ``@`` sits where only an unescaped password puts one: in a TCP URL's
    path, in the fragment, or in a query parameter's name."""
    if "@" in parts.fragment:
        return True
    if parts.scheme != "unix" and "@" in parts.path:
        return True
    return any("@" in name for name, _ in parse_qsl(parts.query, keep_blank_values=True))


def _check_db(shown: str, db: str) -> None:
    if not (db.isascii() and db.isdigit()):
        raise BadRedisURL(f"{shown!r} selects database {db!r}: it must be a non-negative integer")
