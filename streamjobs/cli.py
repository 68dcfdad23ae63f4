"""Command line: ``streamjobs worker`` and ``streamjobs demo``.

Only this module installs signal handlers: SIGTERM or SIGINT starts a graceful
shutdown; a second one stops at once.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import signal
import sys
from collections.abc import Sequence
from typing import Any

import anyio

from .config import ClusterMode, ConsumerConfig, RecoveryConfig
from .consumer import StreamConsumer
from .exceptions import ConfigurationError, StreamJobsError

DEFAULT_URL = "redis://127.0.0.1:6379/0"


class CliError(Exception):
    """A one-line error for the user (no traceback)."""


def load_consumer_class(path: str) -> type[StreamConsumer]:
    """Import ``MODULE:CLASS`` and check it is a concrete StreamConsumer subclass.

    Raises:
        CliError: with a one-line explanation.
    """
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise CliError(f"expected MODULE:CLASS, got {path!r}")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise CliError(f"cannot import module {module_name!r}: {exc}") from None
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise CliError(f"module {module_name!r} has no attribute {attr!r}") from None
    if not isinstance(obj, type) or not issubclass(obj, StreamConsumer):
        raise CliError(f"{path} is not a StreamConsumer subclass")
    if getattr(obj, "__abstractmethods__", None):
        raise CliError(f"{path} does not implement handle()")
    return obj


def _worker_args(sub: Any) -> None:
    p = sub.add_parser("worker", help="run consumers of a StreamConsumer subclass")
    p.add_argument("target", metavar="MODULE:CLASS")
    p.add_argument("--service", required=True)
    p.add_argument("--redis-url", default=DEFAULT_URL)
    p.add_argument("--cluster", action="store_true", help="connect to an OSS Redis Cluster")
    p.add_argument("--consumer-name", default=None)
    p.add_argument("--concurrency", type=int, default=10, help="max concurrent streams")
    p.add_argument("--lock-ttl", type=float, default=10.0, help="lock TTL, seconds")
    p.add_argument("--heartbeat", type=float, default=None, help="heartbeat interval, seconds")
    p.add_argument("--batch", type=int, default=100, help="entries read per round trip")
    p.add_argument("--block-ms", type=int, default=1000)
    p.add_argument("--max-attempts", type=int, default=3, help="handler attempts per entry")
    p.add_argument("--grace", type=float, default=10.0, help="shutdown grace period, seconds")
    p.add_argument("--scan-interval", type=float, default=30.0)
    p.add_argument("--min-idle", type=float, default=None)
    p.add_argument("--max-retries", type=int, default=3)
    p.add_argument(
        "--no-configure-keyspace",
        action="store_true",
        help="never run CONFIG SET notify-keyspace-events (managed Redis)",
    )
    p.add_argument("--log-level", default="INFO")


def build_configs(ns: argparse.Namespace) -> tuple[ConsumerConfig, RecoveryConfig]:
    consumer = ConsumerConfig(
        lock_ttl_s=ns.lock_ttl,
        heartbeat_interval_s=ns.heartbeat,
        max_concurrent_streams=ns.concurrency,
        read_batch_size=ns.batch,
        read_block_ms=ns.block_ms,
        max_handler_attempts=ns.max_attempts,
        shutdown_grace_s=ns.grace,
    )
    min_idle = ns.min_idle if ns.min_idle is not None else max(15.0, ns.lock_ttl * 1.5)
    recovery = RecoveryConfig(
        interval_s=ns.scan_interval,
        min_idle_s=min_idle,
        max_retries=ns.max_retries,
        configure_keyspace_events=not ns.no_configure_keyspace,
    )
    return consumer, recovery


def connect(url: str, *, cluster: bool) -> Any:
    if cluster:
        from redis.asyncio.cluster import RedisCluster

        return RedisCluster.from_url(url, socket_connect_timeout=5)
    from redis.asyncio import Redis

    return Redis.from_url(url, socket_connect_timeout=5, health_check_interval=10)


async def _ping(client: Any, url: str) -> None:
    try:
        with anyio.fail_after(10):
            await client.ping()
    except Exception as exc:
        raise CliError(f"cannot reach Redis at {url}: {exc or type(exc).__name__}") from None


async def run_worker(ns: argparse.Namespace) -> None:
    cls = load_consumer_class(ns.target)
    consumer_cfg, recovery_cfg = build_configs(ns)
    client = connect(ns.redis_url, cluster=ns.cluster)
    try:
        await _ping(client, ns.redis_url)
        consumer = cls(
            client,
            service=ns.service,
            config=consumer_cfg,
            recovery=recovery_cfg,
            cluster_mode=ClusterMode.OSS if ns.cluster else ClusterMode.NONE,
            consumer_name=ns.consumer_name,
        )
        await serve(consumer)
    finally:
        await client.aclose()


async def serve(consumer: StreamConsumer) -> None:
    """Run ``consumer`` until SIGTERM/SIGINT (graceful), or a second signal (immediate)."""
    log = logging.getLogger("streamjobs")
    async with anyio.create_task_group() as tg:

        async def watch_signals() -> None:
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
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
        tg.start_soon(watch_signals)
        log.info("consumer %s of service %s started", consumer.consumer_name, consumer.service)
        try:
            await consumer.run()
        finally:
            consumer_done.set()
            tg.cancel_scope.cancel()
    log.info("consumer %s stopped", consumer.consumer_name)


def _demo_args(sub: Any) -> None:
    p = sub.add_parser("demo", help="a fleet of consumers processing and recovering")
    p.add_argument("--redis-url", default=DEFAULT_URL)
    p.add_argument("--consumers", type=int, default=3)
    p.add_argument("--streams", type=int, default=12)
    p.add_argument("--entries", type=int, default=40)
    p.add_argument("--lock-ttl", type=float, default=3.0)
    p.add_argument("--work-ms", type=int, default=20, help="simulated work per entry, ms")
    p.add_argument("--timeout", type=float, default=50.0, help="give up after this, seconds")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="streamjobs")
    sub = parser.add_subparsers(dest="command", required=True)
    _worker_args(sub)
    _demo_args(sub)
    ns = parser.parse_args(argv)
    level = getattr(ns, "log_level", "INFO")
    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        if ns.command == "worker":
            anyio.run(run_worker, ns)
        else:
            from ._demo import run_demo

            return run_demo(ns)
    except CliError as exc:
        print(f"streamjobs: error: {exc}", file=sys.stderr)
        return 2
    except ConfigurationError as exc:
        print(f"streamjobs: invalid configuration: {exc}", file=sys.stderr)
        return 2
    except StreamJobsError as exc:
        print(f"streamjobs: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0
