"""Command line: ``streamjobs worker``, and the operator commands ``status``, ``dlq``,
``cancel`` and ``consumers``.

This module is the entry point: :func:`main` parses the command line, runs one command
(connect, run, close) and turns what it raised into one line and an exit code. It also
loads and builds the worker's consumer, the one part that needs the consumer classes.
The rest is in private modules, one responsibility each:

* ``_cli_worker_options``: the worker's options, their ``STREAMJOBS_*`` variables, the
  configurations they give;
* ``_cli_connection``: the Redis URL (flag, file, environment, default), the client and
  its PING;
* ``_cli_worker``: running the built consumer until a signal stops it (the worker's
  signal handlers), and the ``--metrics-port`` endpoint;
* ``_cli_errors``: the one-line errors and the exit codes;
* ``_cli_ops``: the operator commands.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import inspect
import logging
import os
import sys
import traceback
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TextIO, cast

import anyio

from . import _cli_ops as ops
from ._cli_connection import DEFAULT_URL as DEFAULT_URL
from ._cli_connection import check_connection as check_connection
from ._cli_connection import connect as connect
from ._cli_connection import redis_url as redis_url
from ._cli_errors import CliError as CliError
from ._cli_errors import exit_code, unwrap
from ._cli_worker import metrics_recorder, open_metrics
from ._cli_worker import serve as serve
from ._cli_worker import stop_signals as stop_signals
from ._cli_worker_options import _env_options as _env_options
from ._cli_worker_options import _worker_args as _worker_args
from ._cli_worker_options import apply_environment as apply_environment
from ._cli_worker_options import build_configs as build_configs
from ._cli_worker_options import env_name as env_name
from ._cli_worker_options import log_level
from ._urls import ENV_VAR, redact, scrub
from .config import ClusterMode
from .consumer import StreamConsumer
from .exceptions import ConfigurationError, InvalidStreamName
from .group import GroupConsumer


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


# Loading and building the target stay in the entry point, which imports consumer.py
# anyway: a module between the two would lengthen the longest import chain
# (tests/unit/test_module_structure.py).
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


async def run_worker(ns: argparse.Namespace) -> None:
    consumer_cfg, recovery_cfg = build_configs(ns)
    target = load_consumer_target(ns.target)
    url = redis_url(ns)
    try:
        client = connect(url, cluster=ns.cluster)
    except ValueError as exc:  # what check() does not catch, redis-py refuses here
        raise CliError(f"invalid Redis URL {redact(url)}: {scrub(str(exc), url)}") from None
    recorder = None if ns.metrics_port is None else metrics_recorder()
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
        code = exit_code(unwrap(exc))
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


if __name__ == "__main__":
    sys.exit(main())
