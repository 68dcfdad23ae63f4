"""The soak's producer: streams at a steady rate, every write exactly once.

It keeps ``open_streams`` streams open; each tick (``1 / rate`` seconds) it appends the
next entry to a random open stream, closes a stream (``close_stream()``) once it holds
``entries_per_stream`` entries and opens a new one (``add_stream()``) in its place.

Writes go through :class:`streamjobs.Producer` on a client that never re-sends a
command. When a write fails its outcome is unknown (the reply may have been lost
after the server applied it), so before writing again the producer reads back
whether it landed: the last entry of the stream (the producer is the stream's only
writer and appends one entry at a time), or, for an assignment, the assignment and
dead-letter streams. That makes every entry exist once, so "produced" is exact, and
a duplicated assignment (which would never finish) cannot happen.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final

import anyio

from streamjobs import InvalidStreamName, Producer
from streamjobs._keys import Keys

WRITE_TIMEOUT_S: Final = 90.0
_PAD: Final = "x" * 48


class ProducerError(RuntimeError):
    """A write could not be completed within :data:`WRITE_TIMEOUT_S`."""


@dataclass
class Produced:
    """One produced stream."""

    name: str
    assignment_id: str = ""
    entries: list[tuple[str, int, str]] = field(default_factory=list)  # (id, seq, kind)
    closed: bool = False
    eos_id: str = ""


@dataclass(frozen=True)
class ProducePlan:
    service: str
    run_id: str
    rate: float
    open_streams: int
    entries_per_stream: int
    work_ms: int
    poison_rate: float
    flaky_rate: float


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class StreamProducer:
    def __init__(self, client: Any, plan: ProducePlan, rng: random.Random) -> None:
        self.client = client
        self.plan = plan
        self.rng = rng
        self.keys = Keys(plan.service)
        self.producer = Producer(client, service=plan.service)
        self.streams: dict[str, Produced] = {}
        self.errors: Counter[str] = Counter()
        self.error_samples: dict[str, str] = {}
        self.confirmed_after_error = 0  # failed writes that had landed after all
        self.entries = 0
        self._next_stream = 0

    @property
    def open_count(self) -> int:
        return sum(1 for s in self.streams.values() if not s.closed)

    # -- the loop ------------------------------------------------------------------------

    async def run(self, stop_at: float) -> None:
        """Produce until the monotonic time ``stop_at``, then close every open stream."""
        plan = self.plan
        period = 1.0 / plan.rate
        opened: list[Produced] = []
        next_t = time.monotonic()
        while time.monotonic() < stop_at:
            while len(opened) < plan.open_streams:
                opened.append(await self._open())
            stream = self.rng.choice(opened)
            await self._append(stream)
            if len(stream.entries) >= plan.entries_per_stream:
                await self._close(stream)
                opened.remove(stream)
            next_t += period
            now = time.monotonic()
            if next_t < now - 1.0:  # fell behind (an outage): do not burst to catch up
                next_t = now
            await anyio.sleep(max(0.0, next_t - now))
        for stream in opened:
            await self._close(stream)

    async def _open(self) -> Produced:
        name = f"soak-{self.plan.run_id}-{self._next_stream:05d}"
        self._next_stream += 1
        stream = self.streams[name] = Produced(name)
        info = {"work_ms": self.plan.work_ms}
        stream.assignment_id = await self._write(
            f"add_stream({name})",
            lambda: self.producer.add_stream(name, info),
            lambda: self._find_assignment(name),
        )
        return stream

    async def _append(self, stream: Produced) -> None:
        seq = len(stream.entries)
        kind = ""
        roll = self.rng.random()
        if roll < self.plan.poison_rate:
            kind = "poison"
        elif roll < self.plan.poison_rate + self.plan.flaky_rate:
            kind = "flaky"
        fields = {"seq": str(seq), "pad": _PAD}
        if kind:
            fields[kind] = "1"
        entry_id = await self._write(
            f"append({stream.name}, seq {seq})",
            lambda: self.producer.append(stream.name, fields),
            lambda: self._find_last(stream.name, lambda f: f.get(b"seq") == str(seq).encode()),
        )
        stream.entries.append((entry_id, seq, kind))
        self.entries += 1

    async def _close(self, stream: Produced) -> None:
        stream.eos_id = await self._write(
            f"close_stream({stream.name})",
            lambda: self.producer.close_stream(stream.name),
            lambda: self._find_last(stream.name, lambda f: b"_eos" in f),
        )
        stream.closed = True

    # -- exactly-once writes ---------------------------------------------------------------

    async def _write(
        self,
        what: str,
        attempt: Callable[[], Awaitable[str]],
        landed: Callable[[], Awaitable[str | None]],
    ) -> str:
        """Run ``attempt``; after a failure, write again only if ``landed`` finds nothing."""
        deadline = time.monotonic() + WRITE_TIMEOUT_S
        delay = 0.05
        last_error = ""
        while True:
            try:
                return await attempt()
            except (TypeError, InvalidStreamName):
                raise  # a bug here, not a fault
            except Exception as exc:
                last_error = self._note(exc)
            while True:  # the outcome is unknown: find out
                if time.monotonic() > deadline:
                    raise ProducerError(
                        f"could not {what} within {WRITE_TIMEOUT_S:g}s: {last_error}"
                    )
                await anyio.sleep(delay)
                delay = min(delay * 2, 1.0)
                try:
                    found = await landed()
                    break
                except Exception as exc:
                    last_error = self._note(exc)
            if found is not None:
                self.confirmed_after_error += 1
                return found

    def _note(self, exc: Exception) -> str:
        name = type(exc).__name__
        self.errors[name] += 1
        text = f"{name}: {exc}"
        self.error_samples.setdefault(name, text[:300])
        return text

    async def _find_last(
        self, name: str, matches: Callable[[dict[bytes, bytes]], bool]
    ) -> str | None:
        reply = await self.client.xrevrange(name, count=1)
        if reply:
            entry_id, fields = reply[0]
            if matches(fields):
                return _text(entry_id)
        return None

    async def _find_assignment(self, name: str) -> str | None:
        wanted = name.encode()
        for key in (self.keys.assignments, self.keys.dead_letters):
            for entry_id, fields in await self.client.xrange(key):
                if fields.get(b"stream") == wanted:
                    return _text(entry_id)
        return None
