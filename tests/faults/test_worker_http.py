"""``streamjobs worker --metrics-port`` as Prometheus and Kubernetes see it: real
worker processes answering ``/metrics``, ``/healthz`` and ``/readyz`` over HTTP, through
a Redis outage and across a kill -9 recovery."""

from __future__ import annotations

import re
import signal
import urllib.error
import urllib.request

from redis import Redis as SyncRedis

from streamjobs.testing import RedisServer, WorkerFleet, free_port
from tests.harness.plugin import WorkerFleetFactory

from ._history import all_done, assert_clean, owners, produce, wait_for

TARGET = "tests.faults.workers:RecordingWorker"


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:  # not listening yet
        return 0, str(exc)


def sample(text: str, name: str, **labels: str) -> float:
    """One sample's value from a Prometheus text exposition (0 if absent)."""
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_probes_follow_redis_through_an_outage(
    server: RedisServer, service: str, worker_fleet_factory: WorkerFleetFactory
) -> None:
    port = free_port()
    fleet = worker_fleet_factory(server.url, TARGET, ["--metrics-port", str(port)])
    worker = fleet.start("w1")
    wait_for(lambda: get(port, "/readyz")[0] == 200, 30, "/readyz 200")
    assert get(port, "/healthz") == (200, "ok\n")
    status, body = get(port, "/metrics")
    assert status == 200
    assert "# TYPE streamjobs_entry_handling_seconds histogram" in body
    assert get(port, "/nope")[0] == 404

    server.stop()
    wait_for(lambda: get(port, "/readyz")[0] == 503, 30, "/readyz 503 with Redis stopped")
    status, body = get(port, "/readyz")
    assert "Redis has not answered" in body, body
    # The worker itself is fine: its loops turn, and it must not be restarted for this.
    assert get(port, "/healthz")[0] == 200
    assert worker.alive()

    server.start()
    wait_for(lambda: get(port, "/readyz")[0] == 200, 60, "/readyz 200 once Redis is back")
    assert worker.stop() == 0
    wait_for(lambda: get(port, "/healthz")[0] == 0, 10, "the port closed with the worker")


def test_metrics_show_a_kill_9_recovery(
    server: RedisServer,
    sync: SyncRedis,
    service: str,
    uid: str,
    worker_fleet_factory: WorkerFleetFactory,
) -> None:
    """The survivor's /metrics count the re-queue and the recovery latency (from the
    dead owner's lock deadline to the survivor taking the lock: about a lock TTL)."""
    ttl_s = 2.0
    ports = {"a": free_port(), "b": free_port()}
    fleets: dict[str, WorkerFleet] = {}
    for name, port in ports.items():
        fleets[name] = worker_fleet_factory(
            server.url,
            TARGET,
            ["--lock-ttl", str(ttl_s), "--metrics-port", str(port), "--block-ms", "200"],
        )
    victim = fleets["a"].start("a")
    wait_for(lambda: get(ports["a"], "/readyz")[0] == 200, 30, "a ready")
    stream = f"slow:{uid}"
    expected = produce(sync, service, [stream], 40, {"work_ms": 100})
    wait_for(lambda: owners(sync, service, [stream]).get(stream) == "a", 30, "a owns it")
    survivor = fleets["b"].start("b")
    wait_for(lambda: get(ports["b"], "/readyz")[0] == 200, 30, "b ready")
    victim.signal(signal.SIGKILL)
    wait_for(lambda: all_done(sync, service, expected), 60, "every entry handled")
    assert_clean(sync, service, [stream])

    def recovered() -> str | None:
        status, body = get(ports["b"], "/metrics")
        latency = "streamjobs_recovery_latency_seconds_count"
        return body if status == 200 and sample(body, latency, service=service) >= 1 else None

    body = wait_for(recovered, 30, "the recovery in b's /metrics")
    assert sample(body, "streamjobs_recoveries_total", service=service, outcome="requeued") >= 1
    latency_s = sample(body, "streamjobs_recovery_latency_seconds_sum", service=service)
    # From the lock's deadline: a few sweeps later, not a TTL plus the scan interval.
    assert 0 <= latency_s <= ttl_s + 1, body
    assert sample(body, "streamjobs_stream_events_total", service=service, event="finished") == 1
    ok = sample(body, "streamjobs_entry_handling_seconds_count", service=service, outcome="ok")
    assert ok >= 1
    # The process's own series, as a Prometheus client has them; / is not the metrics.
    assert sample(body, "process_resident_memory_bytes") > 0
    assert sample(body, "process_open_fds") > 0
    assert "python_info{" in body
    assert "python_gc_objects_collected_total{" in body
    status, text = get(ports["b"], "/")
    assert status == 404
    assert "streamjobs_" not in text
    assert survivor.stop() == 0
