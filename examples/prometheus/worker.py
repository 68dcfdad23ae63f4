"""Prometheus metrics of a consumer: PrometheusRecorder, a /metrics endpoint, one scrape.

    python examples/prometheus/worker.py [REDIS_URL]

It runs ``Thumbnailer`` with ``metrics=PrometheusRecorder()``, serves the recorder's
registry on ``http://127.0.0.1:<free port>/metrics`` with ``prometheus_client``, queues
two albums of five images (in each, one image fails once and is retried), waits until both
are done, then scrapes the endpoint once over HTTP, as Prometheus would, and prints
the ``streamjobs_*`` samples of this service (histogram buckets left out).

In production, let the CLI serve the same registry, with ``/healthz`` and ``/readyz``::

    PYTHONPATH=examples/prometheus streamjobs worker worker:Thumbnailer \\
        --service thumbnails --metrics-port 9464

and point Prometheus at it (prometheus.yml in this folder).
"""

from __future__ import annotations

import sys
import urllib.request
import uuid
from typing import Any

import anyio
import anyio.to_thread
from prometheus_client import start_http_server
from redis.asyncio import Redis

from streamjobs import ConsumerConfig, Message, Producer, PrometheusRecorder, StreamConsumer
from streamjobs.testing import redis_for_script

ALBUMS, IMAGES = 2, 5


class Thumbnailer(StreamConsumer):
    """Makes one thumbnail per entry; an album (a stream) ends with its end marker."""

    async def handle(self, message: Message) -> None:
        if message.fields["image"] == "img-3.jpg" and message.attempt == 1:
            raise OSError("thumbnail store busy")  # retried with backoff, then succeeds
        await anyio.sleep(0.01)  # the actual resizing


class CountingThumbnailer(Thumbnailer):
    """The same handler, plus an event this script waits on."""

    def __init__(self, redis: Any, **kwargs: Any) -> None:
        super().__init__(redis, **kwargs)
        self.finished = anyio.Semaphore(0)

    async def on_stream_end(self, stream: str) -> None:
        self.finished.release()


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        body: bytes = response.read()
    return body.decode()


async def main(url: str) -> int:
    redis = Redis.from_url(url)
    service = f"prometheus-{uuid.uuid4().hex[:8]}"
    print(f"service {service}")
    recorder = PrometheusRecorder()  # its own registry: recorder.registry
    server, thread = start_http_server(0, addr="127.0.0.1", registry=recorder.registry)
    metrics_url = f"http://127.0.0.1:{server.server_port}/metrics"
    consumer = CountingThumbnailer(
        redis, service=service, metrics=recorder, config=ConsumerConfig(finished_stream_ttl_s=0)
    )
    try:
        producer = Producer(redis, service=service)
        for album in range(ALBUMS):
            stream = f"{service}:album:{album}"
            await producer.add_stream(stream)
            for n in range(IMAGES):
                await producer.append(stream, {"image": f"img-{n}.jpg"})
            await producer.close_stream(stream)
        async with consumer:
            with anyio.fail_after(20):
                for _ in range(ALBUMS):
                    await consumer.finished.acquire()
            text = await anyio.to_thread.run_sync(scrape, metrics_url)
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
        if keys := [k async for k in redis.scan_iter(match=f"*{service}*")]:
            await redis.delete(*keys)
        await redis.aclose()

    print(f"GET {metrics_url}")
    samples = [
        line
        for line in text.splitlines()
        if line.startswith("streamjobs_")
        and f'service="{service}"' in line
        and "_bucket{" not in line
        and "_created{" not in line
    ]
    for line in samples:
        print(f"  {line}")
    ok = f'streamjobs_entry_handling_seconds_count{{outcome="ok",service="{service}"}}'
    retried = ok.replace('"ok"', '"retried"')
    counts = {s.rsplit(" ", 1)[0]: float(s.rsplit(" ", 1)[1]) for s in samples}
    if counts.get(ok) != ALBUMS * (IMAGES - 1) or counts.get(retried) != ALBUMS:
        print(f"FAILED: expected {ALBUMS * (IMAGES - 1)} ok and {ALBUMS} retried entries")
        return 1
    print(
        f"done: scraped {len(samples)} streamjobs_* samples: "
        f"{int(counts[ok])} entries ok, {int(counts[retried])} retried"
    )
    return 0


if __name__ == "__main__":
    with redis_for_script(__doc__.splitlines()[0]) as url:
        code = anyio.run(main, url)
    sys.exit(code)
