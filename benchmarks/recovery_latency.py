"""Recovery-latency benchmark: how long a dead or stalled owner's streams wait for a
live consumer, against the target p99 <= lock TTL + 1 s.

A private ``redis-server`` (optionally holding ``--unrelated`` keys with a TTL, which
slow Redis's own expiry cycle down), two ``streamjobs worker`` processes of the
:class:`Worker` below: the victim takes ``--streams`` (100) streams, each with entries
that take long to handle, then the survivor starts; then the victim is

* ``kill``: SIGKILLed, or
* ``stop``: SIGSTOPped past its lock TTL (and SIGCONTed once the survivor has
  every stream: it must then hand nothing more to ``handle()``).

For every stream the victim owned, the latency is the time from the kill (or stop) to
the first entry the survivor handled in it (each handled entry is logged in Redis
with its wall-clock time). Reported: p50, p99 and max over the streams, per scenario
and per ``--unrelated`` setting.

Run: ``python -m benchmarks.recovery_latency [--streams 100] [--ttl 3]
[--unrelated 0,100000] [--scenarios kill,stop] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import anyio
from redis import Redis

from streamjobs import Message, StreamConsumer
from streamjobs._wire import build_fields
from streamjobs.testing import RedisServer, WorkerFleet

ROOT = Path(__file__).resolve().parents[1]
TARGET = "benchmarks.recovery_latency:Worker"
ENTRIES = 40
WORK_MS = 100


def log_key(service: str) -> str:
    return f"bench:{{{service}}}:handled"


class Worker(StreamConsumer):
    """Sleeps ``info["work_ms"]`` per entry, then logs ``consumer|stream|unix_ms``."""

    async def handle(self, message: Message) -> None:
        await anyio.sleep(float(message.info.get("work_ms", WORK_MS)) / 1000)
        record = f"{self.consumer_name}|{message.stream}|{int(time.time() * 1000)}"
        await self.redis.rpush(log_key(self.service), record)


@dataclass(frozen=True, slots=True)
class Outcome:
    scenario: str
    unrelated_keys: int
    streams: int
    ttl_s: float
    p50_s: float
    p99_s: float
    max_s: float
    target_s: float
    deciles_s: tuple[float, ...] = ()
    """p0, p10, ..., p100 of the streams' latencies: the distribution's shape."""

    @property
    def met(self) -> bool:
        return self.p99_s <= self.target_s


def _wait(check: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.02)


def _owners(r: Redis, streams: Sequence[str]) -> dict[str, str]:
    tokens = r.mget([f"streamjobs:lock:{{{s}}}" for s in streams])
    return {s: _text(t).rsplit(":", 1)[0] for s, t in zip(streams, tokens, strict=True) if t}


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _fill_unrelated(r: Redis, count: int) -> None:
    pipe = r.pipeline(transaction=False)
    for i in range(count):
        pipe.set(f"unrelated:{i}", "x", ex=3600)
        if i % 10_000 == 9_999:
            pipe.execute()
    pipe.execute()


def run_one(scenario: str, n_streams: int, ttl_s: float, unrelated: int) -> Outcome:
    extra = ["--hz", "10"] if unrelated else []
    server = RedisServer(dir_prefix="streamjobs-bench-", extra_args=extra).start()
    r = Redis(port=server.port)
    service = f"rl-{uuid.uuid4().hex[:8]}"
    args = ["--lock-ttl", str(ttl_s), "--concurrency", str(n_streams), "--block-ms", "500"]
    fleet = WorkerFleet(server.url, service, TARGET, args, pythonpath=[ROOT], cwd=ROOT)
    try:
        if unrelated:
            _fill_unrelated(r, unrelated)
        streams = [f"d:{service}:{i}" for i in range(n_streams)]
        victim = fleet.start("victim")
        lbs = f"streamjobs:{{{service}}}:lbs"
        pipe = r.pipeline(transaction=False)
        for s in streams:
            fields: dict[Any, Any] = dict(build_fields(s, {"work_ms": WORK_MS}))
            pipe.xadd(lbs, fields)
            for i in range(ENTRIES):
                pipe.xadd(s, {"n": str(i)})
            pipe.xadd(s, {"_eos": "1"})
        pipe.execute()
        _wait(lambda: len(_owners(r, streams)) == n_streams, 60, "the victim to own every stream")
        fleet.start("survivor")
        _wait(lambda: fleet.started(fleet.by_name("survivor")), 60, "the survivor to start")
        at_ms = int(time.time() * 1000)
        victim.signal(signal.SIGKILL if scenario == "kill" else signal.SIGSTOP)

        # The log is read from where the last poll stopped: re-reading all of it every
        # 20 ms (thousands of records) took enough of the two cores to slow the
        # survivor's recovery by most of a second.
        first: dict[str, int] = {}
        seen = [r.llen(log_key(service))]  # the victim's records before the signal

        def resumed() -> dict[str, int] | None:
            records = r.lrange(log_key(service), seen[0], -1)
            seen[0] += len(records)
            for raw in records:
                consumer, stream, t = _text(raw).split("|")
                if consumer == "survivor" and stream not in first:
                    first[stream] = int(t)
            return first if len(first) == n_streams else None

        first = _wait(resumed, 120, "the survivor to resume every stream")
        if scenario == "stop":
            victim.signal(signal.SIGCONT)
        latencies = sorted(max(0, t - at_ms) / 1000 for t in first.values())
        p99 = _quantile(latencies, 0.99)
        return Outcome(
            scenario=scenario,
            unrelated_keys=unrelated,
            streams=n_streams,
            ttl_s=ttl_s,
            p50_s=round(statistics.median(latencies), 3),
            p99_s=round(p99, 3),
            max_s=round(latencies[-1], 3),
            target_s=ttl_s + 1,
            deciles_s=tuple(round(_quantile(latencies, q / 10), 3) for q in range(11)),
        )
    finally:
        fleet.close()
        r.close()
        server.stop()


def _quantile(ordered: Sequence[float], q: float) -> float:
    """The nearest-rank ``q`` quantile of ``ordered`` (sorted, not empty)."""
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


DECILES = " | ".join(f"p{10 * q} s" for q in range(11))
DECILES_HEADER = f"| scenario | unrelated TTL keys | {DECILES}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.recovery_latency")
    parser.add_argument("--streams", type=int, default=100)
    parser.add_argument("--ttl", type=float, default=3.0)
    parser.add_argument("--unrelated", default="0,100000", help="comma-separated key counts")
    parser.add_argument("--scenarios", default="kill,stop")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH")
    ns = parser.parse_args(argv)
    outcomes = []
    print("| scenario | unrelated TTL keys | streams | p50 s | p99 s | max s | target s | met |")
    print("|---|---|---|---|---|---|---|---|")
    for unrelated in (int(x) for x in ns.unrelated.split(",")):
        for scenario in ns.scenarios.split(","):
            o = run_one(scenario, ns.streams, ns.ttl, unrelated)
            outcomes.append(o)
            print(
                f"| {o.scenario} | {o.unrelated_keys:,} | {o.streams} | {o.p50_s:.2f} | "
                f"{o.p99_s:.2f} | {o.max_s:.2f} | {o.target_s:.1f} | {'yes' if o.met else 'no'} |",
                flush=True,
            )
    # The distribution, for the chart (python -m benchmarks --plot).
    print()
    print(f"{DECILES_HEADER} |")
    print("|---|---|" + "---|" * 11)
    for o in outcomes:
        cells = " | ".join(f"{d:.2f}" for d in o.deciles_s)
        print(f"| {o.scenario} | {o.unrelated_keys:,} | {cells} |", flush=True)
    if ns.json is not None:
        ns.json.write_text(json.dumps([asdict(o) | {"met": o.met} for o in outcomes], indent=2))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
