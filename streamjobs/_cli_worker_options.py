"""The ``streamjobs worker`` command's options: its parser, the ``STREAMJOBS_*``
environment variables that fill what the flags do not, and the configurations and log
level they give; a value that breaks a rule is reported against its source (a flag, or
``VAR=value``).
"""

from __future__ import annotations

import argparse
import enum
import os
from collections.abc import Callable, Mapping
from typing import Any

from ._cli_connection import DEFAULT_URL
from ._cli_errors import CliError
from ._urls import ENV_VAR
from .config import ConsumerConfig, Liveness, RecoveryConfig, default_min_idle_s
from .exceptions import ConfigurationError

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def _enum(cls: type[enum.Enum]) -> Callable[[str], Any]:
    """An argparse type for the enum ``cls`` by value, whose error lists the choices."""
    choices = ", ".join(str(m.value) for m in cls)

    def convert(value: str) -> Any:
        try:
            return cls(value.strip().lower())
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not one of: {choices}") from None

    convert.__name__ = cls.__name__
    return convert


ENV_PREFIX = "STREAMJOBS_"
"""Every ``streamjobs worker`` option ``--some-option`` is also read from the
environment variable ``STREAMJOBS_SOME_OPTION``; a flag wins over it."""

_DEFAULTS: dict[str, Any] = {"metrics_host": "0.0.0.0", "log_level": "INFO"}
"""Defaults of worker options resolved after the environment (argparse's are None, so
that an option not given can be told from one given its default value)."""

_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")


def _positive_int(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def env_name(flag: str) -> str:
    """The environment variable of option ``flag``: ``--lock-ttl`` -> ``STREAMJOBS_LOCK_TTL``."""
    return ENV_PREFIX + flag.lstrip("-").upper().replace("-", "_")


def _env_options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The options of ``parser`` that the environment can set (not ``--help``)."""
    return [
        a
        for a in parser._actions
        if a.option_strings and not isinstance(a, argparse._HelpAction | argparse._VersionAction)
    ]


def _from_env(action: argparse.Action, name: str, raw: str) -> Any:
    """``raw`` (the value of environment variable ``name``) converted as ``action``
    converts its argument.

    Raises:
        CliError: it cannot be converted (names the variable, and an enum's choices).
    """
    if isinstance(action, argparse._StoreTrueAction):
        value = raw.strip().lower()
        if value in _TRUE:
            return True
        if value in _FALSE:
            return False
        raise CliError(f"{name}={raw!r}: expected one of {', '.join(_TRUE + _FALSE[:-1])}")
    convert = action.type if callable(action.type) else str
    try:
        return convert(raw)
    except argparse.ArgumentTypeError as exc:
        raise CliError(f"{name}: {exc}") from None
    except (TypeError, ValueError):
        kind = getattr(convert, "__name__", "a")
        raise CliError(f"{name}: invalid {kind} value {raw!r}") from None


def apply_environment(
    parser: argparse.ArgumentParser, ns: argparse.Namespace, env: Mapping[str, str] = os.environ
) -> None:
    """Fill the options of ``ns`` (parsed by the worker's ``parser``) that were not given
    from their ``STREAMJOBS_*`` variables, then from :data:`_DEFAULTS`; record in
    ``ns.sources`` where each value came from (a flag, or ``VAR=value``), so that a
    value that breaks a rule is reported against its source.

    The Redis URL's own order (flag, file, variable) is :func:`redis_url`'s.

    Raises:
        CliError: a variable cannot be converted, or two exclusive options were set.
    """
    sources: dict[str, str] = {}
    for action in _env_options(parser):
        flag, dest = action.option_strings[-1], action.dest
        given = getattr(ns, dest, None)
        if isinstance(action, argparse._StoreTrueAction) and given:
            sources[dest] = flag
            continue
        if given is not None and not isinstance(action, argparse._StoreTrueAction):
            sources[dest] = flag
            continue
        name = env_name(flag)
        if dest in ("redis_url", "redis_url_file") or env.get(name) is None:
            continue
        if isinstance(action, argparse._AppendAction):
            # A list option (--stream): names separated by commas.
            value: Any = [part.strip() for part in env[name].split(",") if part.strip()]
        else:
            value = _from_env(action, name, env[name])
        if isinstance(action, argparse._StoreTrueAction) and not value:
            continue
        setattr(ns, dest, value)
        sources[dest] = f"{name}={env[name]}"
    if getattr(ns, "allow_eviction", False) and getattr(ns, "require_noeviction", False):
        raise CliError(
            f"{sources['allow_eviction']} and {sources['require_noeviction']} contradict each other"
        )
    for dest, default in _DEFAULTS.items():
        if getattr(ns, dest, None) is None:
            setattr(ns, dest, default)
    if getattr(ns, "service", None) is None:
        raise CliError(f"--service is required (or set {env_name('--service')})")
    ns.sources = sources


# Options that set one configuration field each: (flag, field, type, help). Their
# defaults are the dataclasses' own: an option not given is not passed on.
_CONSUMER_OPTIONS: tuple[tuple[str, str, Callable[[str], Any], str], ...] = (
    ("--concurrency", "max_concurrent_streams", int, "max concurrent streams"),
    ("--lock-ttl", "lock_ttl_s", float, "lock TTL, seconds"),
    ("--heartbeat", "heartbeat_interval_s", float, "heartbeat interval, seconds"),
    ("--batch", "read_batch_size", int, "entries read per round trip"),
    ("--block-ms", "read_block_ms", int, "how long an idle read blocks, milliseconds"),
    ("--max-attempts", "max_handler_attempts", int, "handler attempts per entry"),
    ("--grace", "shutdown_grace_s", float, "shutdown grace period, seconds"),
    ("--handler-timeout", "handler_timeout_s", float, "longest handle() call, seconds"),
    ("--liveness", "liveness", _enum(Liveness), "lock or session (docs/design.md#liveness)"),
)
_RECOVERY_OPTIONS: tuple[tuple[str, str, Callable[[str], Any], str], ...] = (
    ("--scan-interval", "interval_s", float, "reconciliation scan period, seconds"),
    ("--min-idle", "min_idle_s", float, "scan only assignments idle this long, seconds"),
    ("--max-retries", "max_retries", int, "re-queues before an assignment is dead-lettered"),
)


def _worker_args(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "worker",
        help="run a consumer of a StreamConsumer or GroupConsumer subclass, or a factory",
        description="Run a consumer of MODULE:NAME until SIGTERM, SIGINT or SIGHUP (a "
        "graceful stop: streams are handed back; a second signal stops at once).",
        epilog=f"Every option can also come from the environment variable shown with it "
        f"({ENV_PREFIX}<OPTION>; a flag wins over it; a flag's variable takes 1/true/yes/on "
        f"or 0/false/no/off). The Redis URL is, in this order: --redis-url; else the "
        f"contents of --redis-url-file (stripped); else ${ENV_VAR}; else the contents of "
        f"${ENV_VAR}_FILE; else {DEFAULT_URL}. Giving both --redis-url and "
        "--redis-url-file is an error. Passwords are shown as ***.",
    )
    p.add_argument(
        "target",
        metavar="MODULE:NAME",
        help="a StreamConsumer or GroupConsumer subclass, or a factory: a callable (sync "
        "or async) that gets the consumer's keyword arguments (redis, service, config, "
        "recovery, cluster_mode, consumer_name, metrics; streams with --stream) and "
        "returns a consumer",
    )
    p.add_argument("--service", default=None, help="the service name (required)")
    p.add_argument(
        "--stream",
        action="append",
        default=None,
        metavar="NAME",
        help="a stream a GroupConsumer reads (repeat for more; overrides the class's "
        "'streams'); in the environment, names separated by commas",
    )
    p.add_argument(
        "--redis-url",
        default=None,
        help=f"Redis URL; takes precedence over --redis-url-file and ${ENV_VAR}, but any "
        f"user sees it in ps: prefer those for a password (default {DEFAULT_URL})",
    )
    p.add_argument(
        "--redis-url-file",
        default=None,
        metavar="PATH",
        help=f"read the Redis URL from this file (contents stripped); used when "
        f"--redis-url is not given, before ${ENV_VAR}",
    )
    p.add_argument("--cluster", action="store_true", help="connect to an OSS Redis Cluster")
    for flag, field, kind, text in (*_CONSUMER_OPTIONS, *_RECOVERY_OPTIONS):
        p.add_argument(flag, dest=field, type=kind, default=None, help=f"{text} ({field})")
    eviction = p.add_mutually_exclusive_group()
    eviction.add_argument(
        "--allow-eviction",
        action="store_true",
        help="start even if maxmemory-policy is not noeviction (require_noeviction=False); "
        "Redis may then evict locks and queued assignments",
    )
    eviction.add_argument(
        "--require-noeviction",
        action="store_true",
        help="refuse to start unless maxmemory-policy is noeviction (the default)",
    )
    p.add_argument(
        "--no-configure-keyspace",
        action="store_true",
        help="never run CONFIG SET notify-keyspace-events (managed Redis)",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        metavar="PORT",
        help="serve /metrics (Prometheus), /healthz and /readyz on this port (0: any "
        "free port, logged at start)",
    )
    p.add_argument(
        "--metrics-host",
        default=None,
        metavar="ADDR",
        help="address the metrics port listens on (default 0.0.0.0: every interface)",
    )
    p.add_argument(
        "--log-level", default=None, help=f"one of {', '.join(LOG_LEVELS)} (default INFO)"
    )
    p.add_argument("--consumer-name", default=None, help="default: host-pid-random")
    p.add_argument(
        "--workers",
        type=_positive_int,
        default=None,
        metavar="N",
        help="run N worker processes under one supervisor that restarts any that dies "
        "(default 1); with --consumer-name NAME they are NAME-0..NAME-(N-1), with "
        "--metrics-port P they listen on P..P+N-1",
    )
    for action in _env_options(p):
        variable = env_name(action.option_strings[-1])
        action.help = f"{action.help or ''} [env {variable}]".strip()
    parser: argparse.ArgumentParser = p
    return parser


def _given(
    ns: argparse.Namespace, options: tuple[tuple[str, str, Callable[[str], Any], str], ...]
) -> dict[str, Any]:
    return {f: getattr(ns, f) for _, f, _, _ in options if getattr(ns, f) is not None}


def build_configs(ns: argparse.Namespace) -> tuple[ConsumerConfig, RecoveryConfig]:
    """The configurations the command line asks for; unset options keep their defaults.

    Raises:
        ConfigurationError: a value breaks a rule (names the field).
    """
    try:
        consumer = ConsumerConfig(
            **_given(ns, _CONSUMER_OPTIONS), require_noeviction=not ns.allow_eviction
        )
        recovery = _given(ns, _RECOVERY_OPTIONS)
        recovery.setdefault("min_idle_s", default_min_idle_s(consumer.lock_ttl_s))
        return consumer, RecoveryConfig(
            **recovery, configure_keyspace_events=not ns.no_configure_keyspace
        )
    except ConfigurationError as exc:
        source = getattr(ns, "sources", {}).get(exc.field)
        if source is None:
            raise
        raise ConfigurationError(source, f"{exc.rule} ({exc.field})") from None


def log_level(value: str, source: str = "--log-level") -> str:
    """``value`` as a logging level name.

    Raises:
        CliError: not one of :data:`LOG_LEVELS` (names ``source``).
    """
    level = value.upper()
    if level not in LOG_LEVELS:
        raise CliError(f"{source}: {value!r} is not one of {', '.join(LOG_LEVELS)}")
    return level
