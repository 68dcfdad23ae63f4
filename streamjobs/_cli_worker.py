"""The ``streamjobs worker`` process around a built consumer: running it until a signal
stops it, and the HTTP endpoint of ``--metrics-port``.

The worker's signal handlers are installed here (the library never installs any):
SIGTERM, SIGINT or SIGHUP starts a graceful shutdown; a second one stops at once
(docs/operations.md#signals-shutdown-and-supervisors).

``--metrics-port`` serves ``/metrics``, ``/healthz`` and ``/readyz``
(docs/operations.md#health-and-readiness).
"""

from __future__ import annotations

import argparse
import logging
import signal
from typing import Any

import anyio
import anyio.abc
from prometheus_client import GCCollector, PlatformCollector, ProcessCollector

from ._base_consumer import BaseConsumer, probes
from ._cli_errors import CliError
from ._http import HealthServer
from .prometheus import PrometheusRecorder

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def metrics_recorder() -> PrometheusRecorder:
    """The recorder of ``--metrics-port``, on a registry of its own."""
    recorder = PrometheusRecorder()
    # The process's own series too (process_*: CPU, memory, file descriptors;
    # python_*: version, garbage collection), as a Prometheus client usually has.
    ProcessCollector(registry=recorder.registry)
    PlatformCollector(registry=recorder.registry)
    GCCollector(registry=recorder.registry)
    return recorder


def open_metrics(
    consumer: BaseConsumer[Any], recorder: PrometheusRecorder, ns: argparse.Namespace
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


async def serve(consumer: BaseConsumer[Any]) -> None:
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
