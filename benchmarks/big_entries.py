"""Big-entries benchmark: how long single Redis commands take while a consumer drains
a stream of large entries.

A private ``redis-server`` logs every command (``slowlog-log-slower-than 0``). One
stream of ``--entries`` entries of ``--mb`` MB each is produced (not measured), then a
:class:`~streamjobs.StreamConsumer` with default settings drains it. The report gives,
per command name, the calls and the slowest call as the server measured it, and the
worst of all: the time every other client of that server may have waited.

Run: ``python -m benchmarks.big_entries [--entries 10] [--mb 50]``. The server is
stopped at the end. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import Sequence

import anyio
import redis.asyncio

from streamjobs import Message, Producer, StreamConsumer
from streamjobs.testing import RedisServer


class BenchmarkError(RuntimeError):
    """The consumer did not handle every entry."""


class _Sink(StreamConsumer):
    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.handled = 0
        self.done = anyio.Event()

    async def handle(self, message: Message) -> None:
        self.handled += 1

    async def on_stream_end(self, stream: str) -> None:
        self.done.set()


async def run(entries: int, mb: int) -> dict[str, tuple[int, int]]:
    """Drain the stream; per command: (calls, slowest microseconds)."""
    server = RedisServer(
        extra_args=["--slowlog-log-slower-than", "0", "--slowlog-max-len", "1000000"]
    ).start()
    client = redis.asyncio.Redis.from_url(server.url)
    try:
        service = f"bench-{uuid.uuid4().hex[:8]}"
        stream = f"big:{service}"
        producer = Producer(client, service=service)
        blob = b"x" * (mb * 1024 * 1024)
        for _ in range(entries):
            await producer.append(stream, {"blob": blob})
        await producer.close_stream(stream)
        await producer.add_stream(stream)
        await client.slowlog_reset()
        consumer = _Sink(client, service=service)
        started = time.perf_counter()
        async with consumer:
            with anyio.fail_after(600):
                await consumer.done.wait()
        elapsed = time.perf_counter() - started
        if consumer.handled != entries:
            raise BenchmarkError(f"handled {consumer.handled} of {entries} entries")
        log = await client.slowlog_get(1_000_000)
    finally:
        await client.aclose()
        server.stop()
    by_command: dict[str, list[int]] = defaultdict(list)
    for item in log:
        name = item["command"].split(b" ", 1)[0].decode().upper()
        by_command[name].append(int(item["duration"]))
    print(f"drained {entries} entries of {mb} MB in {elapsed:.2f} s")
    return {name: (len(d), max(d)) for name, d in by_command.items()}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.big_entries")
    parser.add_argument("--entries", type=int, default=10)
    parser.add_argument("--mb", type=int, default=50)
    ns = parser.parse_args(argv)
    stats = anyio.run(run, ns.entries, ns.mb)
    for name, (calls, slowest) in sorted(stats.items(), key=lambda kv: -kv[1][1]):
        print(f"{name:<12} calls {calls:>6}  slowest {slowest / 1000:9.1f} ms")
    worst = max(stats.items(), key=lambda kv: kv[1][1])
    print(f"worst single command: {worst[0]} {worst[1][1] / 1000:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
