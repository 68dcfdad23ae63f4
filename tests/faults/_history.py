"""History checks for the fault tests (the workers come from ``worker_fleet_factory``)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from redis import Redis as SyncRedis

from streamjobs._keys import Keys
from streamjobs._redis._operator import owner_of

from .workers import log_key


@dataclass
class Record:
    consumer: str
    stream: str
    id: str
    t_ms: int


def history(r: SyncRedis, service: str) -> list[Record]:
    out = []
    for raw in r.lrange(log_key(service), 0, -1):
        c, s, i, t = raw.decode().split("|")
        out.append(Record(c, s, i, int(t)))
    return out


def duplicates(records: list[Record]) -> Counter[tuple[str, str]]:
    counts = Counter((x.stream, x.id) for x in records)
    return Counter({k: v - 1 for k, v in counts.items() if v > 1})


def owners(
    r: SyncRedis, service: str, streams: Sequence[str], prefix: str = "streamjobs"
) -> dict[str, str]:
    """stream -> consumer name currently holding its lock."""
    out = {}
    for s in streams:
        token = r.get(f"{prefix}:lock:{{{s}}}")
        if token:
            out[s] = owner_of(token.decode())
    return out


def wait_for(check: Any, timeout_s: float, what: str, interval_s: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(interval_s)


def assert_clean(r: SyncRedis, service: str, streams: Sequence[str], settle_s: float = 5.0) -> None:
    """Nothing pending or locked afterwards, within ``settle_s``: a stream's lock is
    released just after its assignment is deleted (which is what ``all_done`` sees),
    so the last release may still be on its way."""
    deadline = time.monotonic() + settle_s
    while True:
        try:
            _check_clean(r, service, streams)
            return
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _check_clean(r: SyncRedis, service: str, streams: Sequence[str]) -> None:
    lbs = Keys(service).assignments
    assert r.xpending(lbs, service)["pending"] == 0
    assert r.xlen(lbs) == 0
    for s in streams:
        assert not r.exists(Keys(service).lock(s)), f"lock of {s} left"
        if r.exists(s):
            assert r.xpending(s, service)["pending"] == 0, f"{s} has pending entries"


def produce(
    r: SyncRedis, service: str, streams: Sequence[str], entries: int, info: dict[str, Any]
) -> int:
    """Queue one assignment per stream, append ``entries`` entries to each and close them."""
    from streamjobs._wire import build_fields

    pipe = r.pipeline(transaction=False)
    for s in streams:
        pipe.xadd(Keys(service).assignments, build_fields(s, info))
    for i in range(entries):
        for s in streams:
            pipe.xadd(s, {"n": str(i)})
    for s in streams:
        pipe.xadd(s, {"_eos": "1"})
    pipe.execute()
    return len(streams) * entries


def all_done(r: SyncRedis, service: str, expected: int) -> bool:
    lbs = Keys(service).assignments
    distinct = {(x.stream, x.id) for x in history(r, service)}
    return len(distinct) >= expected and r.xlen(lbs) == 0
