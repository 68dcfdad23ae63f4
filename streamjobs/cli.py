"""Command line: ``streamjobs worker``, and the operator commands ``status``, ``dlq``,
``cancel`` and ``consumers`` (``_cli_ops``).

``--metrics-port`` serves ``/metrics``, ``/healthz`` and ``/readyz``
(docs/operations.md#health-and-readiness).

Only this module installs signal handlers: SIGTERM, SIGINT or SIGHUP starts a
graceful shutdown; a second one stops at once (docs/operations.md#signals-shutdown-and-supervisors).

The Redis URL comes from ``--redis-url``, else ``--redis-url-file``, else the
``STREAMJOBS_REDIS_URL`` environment variable, else :data:`DEFAULT_URL`; it is
checked before use and printed only with its password masked.
"""

from __future__ import annotations

import argparse
import contextlib
import enum
import importlib
import inspect
import logging
import os
import signal
import sys
import traceback
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO, cast

import anyio
import anyio.abc
from prometheus_client import GCCollector, PlatformCollector, ProcessCollector

from . import _cli_ops as ops
from ._base_consumer import probes
from ._http import HealthServer
from ._redis import is_tls_failure, ping
from ._urls import ENV_VAR, BadRedisURL, check, redact, scrub
from .config import ClusterMode, ConsumerConfig, Liveness, RecoveryConfig, default_min_idle_s
from .consumer import StreamConsumer
from .exceptions import ConfigurationError, InvalidStreamName, StreamJobsError
from .group import GroupConsumer
from .prometheus import PrometheusRecorder

DEFAULT_URL = "redis://127.0.0.1:6379/0"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
CONNECT_TIMEOUT_S = 5.0
PING_TIMEOUT_S = 10.0


class CliError(Exception):
    """A one-line error for the user (no traceback)."""


def _where(exc: BaseException) -> str:
    """Where ``exc`` was raised, as ``file:line`` (the innermost frame; a syntax error's
    own position), or '' when unknown."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f"{exc.filename}:{exc.lineno}"
    # The import machinery's own frames say nothing to the user.
    machinery = os.path.dirname(importlib.__file__)
    frames = [
        f
        for f in traceback.extract_tb(exc.__traceback__)
        if not f.filename.startswith(("<", machinery))
    ]
    if not frames or frames[-1].filename == __file__:
        return ""
    return f"{frames[-1].filename}:{frames[-1].lineno}"


def _raised(exc: BaseException) -> str:
    """``exc`` in one line: its type, its message and where it was raised."""
    where = _where(exc)
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return f"{text} ({where})" if where else text


AnyConsumer = StreamConsumer[Any] | GroupConsumer[Any]
ConsumerFactory = Callable[..., "AnyConsumer | Awaitable[AnyConsumer]"]


def load_consumer_target(path: str) -> type[AnyConsumer] | ConsumerFactory:
    """Import ``MODULE:NAME``: a concrete StreamConsumer or GroupConsumer subclass, or
    a callable that builds a consumer (a factory, see :func:`build_consumer`).

    Raises:
        CliError: with a one-line explanation (an import failure names the
            exception's type, file and line).
    """
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise CliError(f"expected MODULE:NAME, got {path!r}")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise CliError(f"cannot import module {module_name!r}: {_raised(exc)}") from None
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise CliError(f"module {module_name!r} has no attribute {attr!r}") from None
    if isinstance(obj, type):
        if not issubclass(obj, StreamConsumer | GroupConsumer):
            raise CliError(
                f"{path} is not a StreamConsumer or GroupConsumer subclass, or a factory"
            )
        if getattr(obj, "__abstractmethods__", None):
            raise CliError(f"{path} does not implement handle()")
        return obj
    if not callable(obj):
        raise CliError(f"{path} is not a StreamConsumer or GroupConsumer subclass, or a factory")
    return cast(ConsumerFactory, obj)


def load_consumer_class(path: str) -> type[StreamConsumer[Any]]:
    """Import ``MODULE:CLASS`` and check it is a concrete StreamConsumer subclass.

    Raises:
        CliError: with a one-line explanation.
    """
    target = load_consumer_target(path)
    if not isinstance(target, type) or not issubclass(target, StreamConsumer):
        raise CliError(f"{path} is not a StreamConsumer subclass")
    return target


async def build_consumer(
    target: type[AnyConsumer] | ConsumerFactory, path: str, settings: dict[str, Any]
) -> AnyConsumer:
    """The worker's consumer: ``target(**settings)``, awaited if the factory is async.

    ``settings`` are StreamConsumer's keyword arguments (``redis``, ``service``,
    ``config``, ``recovery``, ``cluster_mode``, ``consumer_name``, and ``metrics`` when
    the worker serves metrics), so a factory can pass them on whole:
    ``def make(**settings): return MyConsumer(db_url=..., **settings)``.

    Raises:
        CliError: building it raised (one line, with the exception's type and where),
            or the factory returned something else than a consumer.
    """
    kind = "class" if isinstance(target, type) else "factory"
    try:
        built: Any = target(**settings)
        if inspect.isawaitable(built):
            built = await built
    except (ConfigurationError, InvalidStreamName):
        raise  # the library's own one-line errors
    except Exception as exc:
        hint = (
            "; a class whose __init__ needs more than the consumer's arguments is run "
            "through a factory (docs/getting-started.md#a-factory)"
            if kind == "class" and isinstance(exc, TypeError)
            else ""
        )
        raise CliError(
            f"cannot build the consumer: {kind} {path} raised {_raised(exc)}{hint}"
        ) from None
    if not isinstance(built, StreamConsumer | GroupConsumer):
        raise CliError(
            f"factory {path} returned {type(built).__name__}, not a StreamConsumer or "
            "a GroupConsumer"
        )
    return built


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


def redis_url(ns: argparse.Namespace, env: Mapping[str, str] = os.environ) -> str:
    """The URL the options and environment ask for, checked.

    Raises:
        CliError: both a URL and a file were given, the file cannot be read or is
            empty, or the URL is malformed (said without its password).
    """
    if ns.redis_url is not None and ns.redis_url_file is not None:
        raise CliError("give --redis-url or --redis-url-file, not both")
    if ns.redis_url is not None:
        url, source = ns.redis_url, "--redis-url"
    elif ns.redis_url_file is not None:
        try:
            url = Path(ns.redis_url_file).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise CliError(f"--redis-url-file: cannot read {ns.redis_url_file}: {exc}") from None
        except UnicodeDecodeError:  # its message would quote the file's bytes
            raise CliError(f"--redis-url-file: {ns.redis_url_file} is not UTF-8 text") from None
        if not url:
            raise CliError(f"--redis-url-file: {ns.redis_url_file} is empty")
        source = "--redis-url-file"
    elif env.get(ENV_VAR):
        url, source = env[ENV_VAR].strip(), ENV_VAR
    elif env.get(ENV_VAR + "_FILE"):
        path = env[ENV_VAR + "_FILE"]
        source = ENV_VAR + "_FILE"
        try:
            url = Path(path).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise CliError(f"{source}: cannot read {path}: {exc}") from None
    else:
        url, source = DEFAULT_URL, "the default URL"
    try:
        return check(url)
    except BadRedisURL as exc:
        raise CliError(f"{source}: {exc}") from None


def log_level(value: str, source: str = "--log-level") -> str:
    """``value`` as a logging level name.

    Raises:
        CliError: not one of :data:`LOG_LEVELS` (names ``source``).
    """
    level = value.upper()
    if level not in LOG_LEVELS:
        raise CliError(f"{source}: {value!r} is not one of {', '.join(LOG_LEVELS)}")
    return level


def connect(url: str, *, cluster: bool, timeout_s: float = CONNECT_TIMEOUT_S) -> Any:
    """A client for ``url`` (not connected yet); connecting gives up after ``timeout_s``."""
    if cluster:
        from redis.asyncio.cluster import RedisCluster

        return RedisCluster.from_url(url, socket_connect_timeout=timeout_s)
    from redis.asyncio import Redis

    return Redis.from_url(url, socket_connect_timeout=timeout_s, health_check_interval=10)


async def check_connection(client: Any, url: str, *, timeout_s: float = PING_TIMEOUT_S) -> None:
    """PING through ``client``.

    Raises:
        CliError: no answer within ``timeout_s`` or an error, said without the URL's
            password; for a ``rediss://`` URL whose handshake fails or times out, that
            the server may not speak TLS.
    """
    try:
        with anyio.fail_after(timeout_s):
            try:
                await ping(client)
            except (ConnectionError, OSError):
                # Once more: a connection the server dropped as we started (a restart,
                # CLIENT KILL) is no reason to give up; a refused one is refused again.
                await anyio.sleep(0.2)
                await ping(client)
    except Exception as exc:
        why = str(exc) or type(exc).__name__
        if url.startswith("rediss://") and is_tls_failure(exc):
            why = (
                f"the TLS handshake failed ({why}): the server may not speak TLS; "
                "use redis:// for a plaintext server"
            )
        raise CliError(f"cannot reach Redis at {redact(url)}: {scrub(why, url)}") from None


async def run_worker(ns: argparse.Namespace) -> None:
    consumer_cfg, recovery_cfg = build_configs(ns)
    target = load_consumer_target(ns.target)
    url = redis_url(ns)
    try:
        client = connect(url, cluster=ns.cluster)
    except ValueError as exc:  # what check() does not catch, redis-py refuses here
        raise CliError(f"invalid Redis URL {redact(url)}: {scrub(str(exc), url)}") from None
    recorder = None
    if ns.metrics_port is not None:
        recorder = PrometheusRecorder()
        # The process's own series too (process_*: CPU, memory, file descriptors;
        # python_*: version, garbage collection), as a Prometheus client usually has.
        ProcessCollector(registry=recorder.registry)
        PlatformCollector(registry=recorder.registry)
        GCCollector(registry=recorder.registry)
    extra: dict[str, Any] = {} if recorder is None else {"metrics": recorder}
    try:
        await check_connection(client, url)
        settings: dict[str, Any] = {
            "redis": client,
            "service": ns.service,
            "config": consumer_cfg,
            "recovery": recovery_cfg,
            "cluster_mode": ClusterMode.OSS if ns.cluster else ClusterMode.NONE,
            "consumer_name": ns.consumer_name,
            **extra,
        }
        if getattr(ns, "stream", None):
            if isinstance(target, type) and issubclass(target, StreamConsumer):
                raise CliError(
                    f"{ns.sources.get('stream', '--stream')}: {ns.target} is a "
                    "StreamConsumer, whose streams come from assignments; --stream names "
                    "the streams of a GroupConsumer"
                )
            settings["streams"] = ns.stream
        consumer = await build_consumer(target, ns.target, settings)
        server = None if recorder is None else open_metrics(consumer, recorder, ns)
        try:
            await serve(consumer)
        finally:
            if server is not None:
                server.close()
    finally:
        # The consumer has stopped: a close that fails (a node gone mid-failover) must
        # not turn a clean stop into a traceback and a failed exit.
        with contextlib.suppress(Exception):
            await client.aclose()


def open_metrics(
    consumer: AnyConsumer, recorder: PrometheusRecorder, ns: argparse.Namespace
) -> HealthServer:
    """Start the HTTP endpoint of ``--metrics-port``.

    Raises:
        CliError: the port is out of range, or cannot be listened on.
    """
    port, host = ns.metrics_port, ns.metrics_host
    if not 0 <= port <= 65535:
        raise CliError(f"--metrics-port: {port} is not a port number (0 to 65535)")
    healthy, ready = probes(consumer)
    try:
        server = HealthServer(recorder.registry, healthy=healthy, ready=ready, host=host, port=port)
    except (OSError, OverflowError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise CliError(f"--metrics-port: cannot listen on {host}:{port}: {why}") from None
    bound_host, bound_port = server.address
    logging.getLogger("streamjobs").info(
        "serving /metrics, /healthz and /readyz on http://%s:%d", bound_host, bound_port
    )
    return server


def stop_signals() -> tuple[signal.Signals, ...]:
    """The signals :func:`serve` stops on: :data:`STOP_SIGNALS`, less SIGHUP when this
    process was started with it ignored (``nohup``), which keeps it ignored."""
    if signal.getsignal(signal.SIGHUP) is signal.SIG_IGN:
        return tuple(s for s in STOP_SIGNALS if s != signal.SIGHUP)
    return STOP_SIGNALS


async def serve(consumer: AnyConsumer) -> None:
    """Run ``consumer`` until SIGTERM, SIGINT or SIGHUP (graceful), or a second one
    (immediate). SIGHUP stops too: a worker whose terminal or session goes away must
    hand its streams back, not die with its locks held (unless started under
    ``nohup``: see :func:`stop_signals`)."""
    log = logging.getLogger("streamjobs")
    async with anyio.create_task_group() as tg:

        async def watch_signals(*, task_status: anyio.abc.TaskStatus[None]) -> None:
            with anyio.open_signal_receiver(*stop_signals()) as signals:
                task_status.started()  # handlers in place before "started" is logged
                async for signum in signals:
                    if consumer_done.is_set():
                        return
                    if stopping.is_set():
                        log.warning("second signal: stopping now")
                        tg.cancel_scope.cancel()
                        return
                    log.info("%s: shutting down gracefully", signal.Signals(signum).name)
                    stopping.set()
                    tg.start_soon(consumer.aclose)

        stopping = anyio.Event()
        consumer_done = anyio.Event()
        await tg.start(watch_signals)
        log.info("consumer %s of service %s started", consumer.consumer_name, consumer.service)
        try:
            await consumer.run()
        finally:
            consumer_done.set()
            tg.cancel_scope.cancel()
    log.info("consumer %s stopped", consumer.consumer_name)


_OPERATIONS: dict[str, Callable[[Any, argparse.Namespace, TextIO], Awaitable[int]]] = {
    "status": ops.run_status,
    "dlq": ops.run_dlq,
    "cancel": ops.run_cancel,
    "consumers": ops.run_consumers,
}


async def run_operation(ns: argparse.Namespace) -> int:
    """One operator command (``status``, ``dlq``, ``cancel``, ``consumers``): connect
    as the worker does, run it, close."""
    url = redis_url(ns)
    try:
        client = connect(url, cluster=ns.cluster)
    except ValueError as exc:
        raise CliError(f"invalid Redis URL {redact(url)}: {scrub(str(exc), url)}") from None
    try:
        await check_connection(client, url)
        return await _OPERATIONS[ns.command](client, ns, sys.stdout)
    finally:
        await client.aclose()


def main(argv: Sequence[str] | None = None) -> int:
    from . import __version__

    parser = argparse.ArgumentParser(prog="streamjobs")
    parser.add_argument("--version", action="version", version=f"streamjobs {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    worker_parser = _worker_args(sub)
    ops.add_commands(sub, ENV_VAR, DEFAULT_URL)
    ns, extra = parser.parse_known_args(argv)
    if extra:  # reported with the usage of the (sub)command that was given them
        _innermost(sub.choices.get(ns.command, parser), ns).error(
            f"unrecognized arguments: {' '.join(extra)}"
        )
    try:
        if ns.command == "worker":
            apply_environment(worker_parser, ns)
        if ns.command != "worker":
            logging.basicConfig(level="WARNING", format="%(levelname)s %(name)s: %(message)s")
            return anyio.run(run_operation, ns)
        level = log_level(ns.log_level, ns.sources.get("log_level", "--log-level"))
        logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        if (ns.workers or 1) > 1:
            return _supervise(ns, sys.argv[2:] if argv is None else list(argv)[1:])
        anyio.run(run_worker, ns)
    except KeyboardInterrupt:
        return 0 if getattr(ns, "watch", None) is not None else 130
    except BaseException as exc:
        code = _exit_code(_unwrap(exc))
        if code is None:
            raise
        return code
    return 0


def _innermost(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> argparse.ArgumentParser:
    """The parser of the deepest subcommand ``ns`` names (``dlq list``, not ``dlq``)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and action.dest:
            chosen = action.choices.get(getattr(ns, action.dest, None) or "")
            if chosen is not None:
                return _innermost(chosen, ns)
    return parser


def _supervise(ns: argparse.Namespace, worker_argv: Sequence[str]) -> int:
    """``--workers N``: check what every child would check first (the settings, the
    target's import), so that a mistake is one line here rather than N restarting
    children; then run the supervisor."""
    from ._supervisor import Supervisor

    build_configs(ns)
    load_consumer_target(ns.target)
    redis_url(ns)
    if ns.metrics_port is not None and not 0 <= ns.metrics_port <= 65535 - ns.workers:
        raise CliError(f"--metrics-port: {ns.metrics_port} + {ns.workers} workers is past 65535")
    return anyio.run(Supervisor(worker_argv, ns.workers, ns.consumer_name, ns.metrics_port).run)


def _unwrap(exc: BaseException) -> BaseException:
    """The one exception inside (nested) single-member exception groups."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _exit_code(exc: BaseException) -> int | None:
    """Print ``exc`` as one line and return the exit code; None for a bug (traceback)."""
    if isinstance(exc, BrokenPipeError):
        # The reader went away (``streamjobs status | head -3``): nothing to say, and
        # the interpreter's final flush must not fail on the closed pipe either.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    if isinstance(exc, CliError | ops.UsageError):
        print(f"streamjobs: error: {exc}", file=sys.stderr)
        return 2
    if isinstance(exc, InvalidStreamName):
        print(f"streamjobs: error: {exc}", file=sys.stderr)
        return 2
    if isinstance(exc, ConfigurationError):
        print(f"streamjobs: invalid configuration: {exc}", file=sys.stderr)
        return 2
    if isinstance(exc, StreamJobsError):
        print(f"streamjobs: error: {exc}", file=sys.stderr)
        return 1
    return None


if __name__ == "__main__":
    sys.exit(main())
