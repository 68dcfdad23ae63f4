"""The worker's HTTP endpoint: ``/metrics``, ``/healthz`` and ``/readyz``
(docs/operations.md#health-and-readiness).

prometheus-client's own handler serves ``/metrics`` (the text exposition, or
OpenMetrics when asked for); the two probes are added to it. It runs in a daemon
thread, as prometheus-client's own server does, so a busy event loop cannot keep
Prometheus from scraping, and a stuck one shows up as ``/healthz`` failing. The
probes only read a few numbers the consumer keeps up to date.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import MetricsHandler

Probe = Callable[[], tuple[bool, str]]
"""Answers (ok, a one-line reason)."""


class HealthServer:
    """Serves ``registry`` and two probes on ``host:port`` until :meth:`close`.

    Raises:
        OSError: the address cannot be bound (in use, not permitted).
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        healthy: Probe,
        ready: Probe,
        host: str = "0.0.0.0",
        port: int = 0,
    ) -> None:
        probes = {"/healthz": healthy, "/readyz": ready}
        metrics_handler = MetricsHandler.factory(registry)

        class Handler(metrics_handler):  # type: ignore[misc,valid-type]
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                probe = probes.get(path)
                if probe is None:
                    if path == "/metrics":
                        super().do_GET()
                    else:
                        self._reply(404, "not found: try /metrics, /healthz or /readyz")
                    return
                try:
                    ok, reason = probe()
                except Exception as exc:  # a probe must answer, never hang up
                    ok, reason = False, f"probe failed: {type(exc).__name__}: {exc}"
                self._reply(200 if ok else 503, reason)

            def _reply(self, status: int, body: str) -> None:
                data = (body + "\n").encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # one line per scrape would drown the worker's own log

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="streamjobs-http", daemon=True
        )
        self._thread.start()

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def close(self) -> None:
        """Stop serving and release the port."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
