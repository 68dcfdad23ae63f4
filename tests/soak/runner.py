"""The soak run: start everything, produce, inject faults, drain, check, report.

See the package docstring (:mod:`tests.soak`) for what is checked and README.md for usage.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import secrets
import shutil
import signal
import sys
import time
import traceback
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import anyio
import anyio.abc
import anyio.to_thread
from redis.asyncio import Redis

from streamjobs import DeadLetterFilter, DeadLetterRecord, DeadLetters
from streamjobs._keys import Keys
from streamjobs.testing import RedisServer, Worker, WorkerFleet

from .groups import TARGET as GROUP_TARGET
from .groups import (
    GroupProducer,
    GroupReport,
    Windows,
    check_groups,
    collect_groups,
    drained,
    until_no_member_alive,
)
from .history import (
    FINISH,
    POISON,
    REJECT,
    TAIL,
    Call,
    ExclusiveReport,
    History,
    Replay,
    account,
    check_exclusive,
    check_order,
    downstream,
    foreign_calls,
    parse,
    replay_caused,
    replay_tainted,
    rerun_jobs,
    restarted_after_finish,
)
from .produce import (
    ALL_MIX,
    CANCEL,
    EARLY_FINISH,
    MIX_CANCEL,
    MIX_FINISH,
    MIX_REJECT,
    MIX_REUSE,
    ProducePlan,
    ProducerError,
    StreamProducer,
)
from .stores import (
    CONN_DROP,
    KILL9,
    PRIMARY_KILL,
    SERVER_RESTART,
    SIGSTOP,
    SIGTERM,
    ClusterStore,
    StandaloneStore,
    Store,
)
from .worker import EVENTS_KEY, GROUP_EVENTS_KEY, HANDLED_KEY, RECORD_URL_ENV, REJECT_REASON

ROOT: Final = Path(__file__).resolve().parents[2]
TARGET: Final = "tests.soak.worker:SoakWorker"
WORKER_FAULTS: Final = (KILL9, SIGSTOP, SIGTERM)
_MONITOR_S: Final = 0.25
_LOG_TAIL_LINES: Final = 40
_EXIT_INTERRUPTED: Final = 130
# How long the drain waits before it checks whether what is left can ever finish.
_DRAIN_PATIENCE_S: Final = 20.0
LOCK_MODE: Final = "lock"
SESSION_MODE: Final = "session"
MIXED: Final = "mixed"


# -- settings ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    target: str
    duration_s: float
    seed: int
    workers: int
    open_streams: int
    entries_per_stream: int
    rate: float
    work_ms: int
    lock_ttl_s: float
    min_idle_s: float
    scan_interval_s: float
    batch: int
    concurrency: int
    grace_s: float
    max_retries: int
    max_attempts: int
    fault_min_s: float
    fault_max_s: float
    faults: tuple[str, ...]
    poison_rate: float
    flaky_rate: float
    drain_timeout_s: float
    progress_s: float
    keep_logs: Path | None
    mix: tuple[str, ...] = ALL_MIX
    reject_rate: float = 0.01
    cancel_rate: float = 0.1
    finish_rate: float = 0.1
    name_pool: int = 18
    replay_every_s: float = 3.0
    liveness: str = MIXED
    group_workers: int = 2
    group_streams: int = 3
    group_rate: float = 30.0

    def worker_args(self) -> list[str]:
        return [
            "--lock-ttl", str(self.lock_ttl_s),
            "--min-idle", str(self.min_idle_s),
            "--scan-interval", str(self.scan_interval_s),
            "--batch", str(self.batch),
            "--concurrency", str(self.concurrency),
            "--grace", str(self.grace_s),
            "--block-ms", "200",
            "--max-retries", str(self.max_retries),
            "--max-attempts", str(self.max_attempts),
        ]  # fmt: skip

    def stop_duration_s(self, rng: random.Random) -> float:
        """How long a SIGSTOP lasts: past the lock TTL, so the stream is taken over."""
        return self.lock_ttl_s + rng.uniform(1.0, 3.0)


ALL_FAULTS: Final = {
    "standalone": (KILL9, SIGSTOP, SIGTERM, SERVER_RESTART, CONN_DROP),
    "cluster": (KILL9, SIGSTOP, SIGTERM, PRIMARY_KILL, CONN_DROP),
}
DEFAULT_TTL_S: Final = {"standalone": 2.5, "cluster": 8.0}


def parse_args(argv: Sequence[str] | None) -> Settings:
    p = argparse.ArgumentParser(
        prog="python -m tests.soak",
        description="Chaos soak of streamjobs: a worker fleet under random faults, "
        "then a check of the whole history. Exit 0 if every check passes, 1 if not.",
    )
    p.add_argument("--target", choices=("standalone", "cluster"), default="standalone")
    p.add_argument("--duration-s", type=float, default=120.0, help="fault/produce phase")
    p.add_argument("--seed", type=int, default=None, help="default: random (printed)")
    p.add_argument("--workers", type=int, default=3, help="consumer processes (>= 3)")
    p.add_argument("--open-streams", type=int, default=12, help="streams open at once")
    p.add_argument("--entries-per-stream", type=int, default=40)
    p.add_argument("--rate", type=float, default=80.0, help="entries produced per second")
    p.add_argument("--work-ms", type=int, default=20, help="simulated work per entry")
    p.add_argument("--lock-ttl", type=float, default=None, help="default 2.5 s, cluster 8 s")
    p.add_argument("--batch", type=int, default=10, help="read_batch_size")
    p.add_argument("--concurrency", type=int, default=12, help="streams per worker")
    p.add_argument("--grace", type=float, default=2.0, help="shutdown_grace_s")
    p.add_argument("--max-retries", type=int, default=10, help="re-queues before DLQ")
    p.add_argument("--max-attempts", type=int, default=3, help="handler attempts per entry")
    p.add_argument("--fault-min-s", type=float, default=2.0)
    p.add_argument("--fault-max-s", type=float, default=5.0)
    p.add_argument(
        "--faults",
        default="all",
        help="comma-separated subset of kill9,sigstop,sigterm,conndrop,restart "
        "(standalone),primary (cluster); default all of the target's",
    )
    p.add_argument("--poison-rate", type=float, default=0.003, help="entries that always fail")
    p.add_argument("--flaky-rate", type=float, default=0.02, help="entries that fail once")
    p.add_argument(
        "--mix",
        default="all",
        help="comma-separated subset of the producer's kinds: cancel (jobs cancelled), "
        "finish (jobs finished early by the handler), reject (entries dead-lettered by "
        "the handler, then replayed), reuse (stream names from a bounded pool); all (the "
        "default) or none",
    )
    p.add_argument("--reject-rate", type=float, default=0.01, help="entries the handler rejects")
    p.add_argument("--cancel-rate", type=float, default=0.1, help="jobs cancelled")
    p.add_argument("--finish-rate", type=float, default=0.1, help="jobs finished early")
    p.add_argument(
        "--name-pool", type=int, default=None, help="stream names (default open streams + 6)"
    )
    p.add_argument("--replay-every-s", type=float, default=3.0, help="DLQ replay period")
    p.add_argument(
        "--liveness",
        choices=(MIXED, LOCK_MODE, SESSION_MODE),
        default=MIXED,
        help="the workers' Liveness; mixed: half LOCK, half SESSION (default)",
    )
    p.add_argument(
        "--group-workers",
        type=int,
        default=2,
        help="GroupConsumer processes sharing --group-streams streams (0: none)",
    )
    p.add_argument("--group-streams", type=int, default=3, help="streams of the shared group")
    p.add_argument(
        "--group-rate", type=float, default=30.0, help="entries/s appended to the group streams"
    )
    p.add_argument("--drain-timeout-s", type=float, default=120.0)
    p.add_argument("--progress-s", type=float, default=3.0)
    p.add_argument("--keep-logs", type=Path, default=None, help="copy all logs here at the end")
    ns = p.parse_args(argv)
    if ns.workers < 3:
        p.error("--workers must be >= 3")
    if ns.group_workers < 0 or ns.group_streams < 1 or ns.group_rate <= 0:
        p.error("need --group-workers >= 0, --group-streams >= 1 and --group-rate > 0")
    if not 0 < ns.fault_min_s <= ns.fault_max_s:
        p.error("need 0 < --fault-min-s <= --fault-max-s")
    for name in ("duration_s", "rate", "drain_timeout_s", "progress_s", "replay_every_s"):
        if getattr(ns, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be > 0")
    if ns.mix in ("all", "none"):
        mix = ALL_MIX if ns.mix == "all" else ()
    else:
        mix = tuple(m.strip() for m in ns.mix.split(",") if m.strip())
        unknown_mix = sorted(set(mix) - set(ALL_MIX))
        if unknown_mix:
            p.error(f"unknown --mix kinds: {unknown_mix} (choose from {ALL_MIX})")
    if ns.cancel_rate + ns.finish_rate > 1:
        p.error("--cancel-rate + --finish-rate must be <= 1")
    pool = ns.name_pool if ns.name_pool is not None else ns.open_streams + 6
    if pool <= ns.open_streams:
        p.error("--name-pool must exceed --open-streams")
    available = ALL_FAULTS[ns.target]
    if ns.faults == "all":
        faults = available
    else:
        faults = tuple(f.strip() for f in ns.faults.split(",") if f.strip())
        unknown = sorted(set(faults) - set(available))
        if unknown:
            p.error(f"faults not available on {ns.target}: {unknown} (choose from {available})")
    ttl = ns.lock_ttl if ns.lock_ttl is not None else DEFAULT_TTL_S[ns.target]
    return Settings(
        target=ns.target,
        duration_s=ns.duration_s,
        seed=ns.seed if ns.seed is not None else secrets.randbelow(2**31),
        workers=ns.workers,
        open_streams=ns.open_streams,
        entries_per_stream=ns.entries_per_stream,
        rate=ns.rate,
        work_ms=ns.work_ms,
        lock_ttl_s=ttl,
        min_idle_s=round(ttl * 1.5, 3),
        scan_interval_s=max(2.0, round(ttl / 2, 3)),
        batch=ns.batch,
        concurrency=ns.concurrency,
        grace_s=ns.grace,
        max_retries=ns.max_retries,
        max_attempts=ns.max_attempts,
        fault_min_s=ns.fault_min_s,
        fault_max_s=ns.fault_max_s,
        faults=faults,
        poison_rate=ns.poison_rate,
        flaky_rate=ns.flaky_rate,
        drain_timeout_s=ns.drain_timeout_s,
        progress_s=ns.progress_s,
        keep_logs=ns.keep_logs,
        mix=mix,
        reject_rate=ns.reject_rate if MIX_REJECT in mix else 0.0,
        cancel_rate=ns.cancel_rate if MIX_CANCEL in mix else 0.0,
        finish_rate=ns.finish_rate if MIX_FINISH in mix else 0.0,
        name_pool=pool if MIX_REUSE in mix else 0,
        replay_every_s=ns.replay_every_s,
        liveness=ns.liveness,
        group_workers=ns.group_workers,
        group_streams=ns.group_streams,
        group_rate=ns.group_rate,
    )


# -- worker processes ------------------------------------------------------------------------

RUNNING, KILLED, TERMINATING, TERMINATED, DIED, FINAL = (
    "running",
    "killed",
    "terminating",
    "terminated",
    "died",
    "stopped at the end",
)


@dataclass
class Proc:
    """One worker process and what the soak did to it."""

    worker: Worker
    liveness: str = LOCK_MODE
    fate: str = RUNNING
    stopped: bool = False  # SIGSTOPped right now
    stops: list[tuple[int, int]] = field(default_factory=list)  # (SIGSTOP, SIGCONT) unix ns
    end_ns: int | None = None
    problem: str | None = None
    group: bool = False  # a GroupConsumer worker (tests/soak/groups.py)

    @property
    def name(self) -> str:
        return self.worker.name


class Gate:
    """Closed while the data store is down or failing over (any task may open it)."""

    def __init__(self) -> None:
        self._closed = 0
        self._opened = anyio.Event()
        self._opened.set()

    def close(self) -> None:
        self._closed += 1
        if self._opened.is_set():
            self._opened = anyio.Event()

    def open(self) -> None:
        self._closed -= 1
        if self._closed == 0:
            self._opened.set()

    def is_open(self) -> bool:
        return self._closed == 0

    async def wait_open(self) -> None:
        while self._closed:
            await self._opened.wait()


def now_ns() -> int:
    return time.time_ns()


# -- the run -------------------------------------------------------------------------------


class Soak:
    def __init__(self, settings: Settings, stack: contextlib.ExitStack) -> None:
        self.s = settings
        self.stack = stack
        self.run_id = secrets.token_hex(3)
        self.service = f"soak-{self.run_id}"
        self.keys = Keys(self.service)
        self.rng = random.Random(settings.seed)
        self.store: Store = StandaloneStore() if settings.target == "standalone" else ClusterStore()
        self.side = RedisServer(dir_prefix="soak-side-")
        self.fleet: WorkerFleet | None = None
        self.procs: list[Proc] = []
        self.faults: Counter[str] = Counter()
        self.fault_log: list[str] = []
        self.infra_errors: list[str] = []
        self.started_mono = time.monotonic()
        self.phase = "start"
        self.producer: StreamProducer | None = None
        self.producer_error: str | None = None
        self.drain_s: float | None = None  # from the end of production to drained
        self.production_stopped = 0.0
        self.drain_problem: str | None = None
        self.dropped_connections = 0
        self.failover_s: list[float] = []
        # Held while the store is down or failing over: workers are not started then
        # (their start-up PING would fail and they would exit with status 2).
        self.gate = Gate()
        self.server_fault_busy = False
        self.ready: set[str] = set()  # workers past start-up (see _poll_ready)
        self._next_worker = 0
        self._side: Any = None
        self._data: Any = None  # the producer's client (no redis-py retries)
        self._check: Any = None  # a client for progress and checks
        self._dlq: DeadLetters | None = None  # replays the handler's rejects
        self._replay_lock = anyio.Lock()
        self.replays: list[Replay] = []  # every dead letter put back
        self.replay_rounds = 0  # replay calls that put something back
        self.replay_skipped = 0  # dead letters a replay left in place (busy, or gone)
        self.replay_errors: Counter[str] = Counter()
        self.replayed_reasons: Counter[str] = Counter()
        self.base_args: list[str] = []
        self.records: list[str] = []  # the workers' records, read at the end
        # The shared group (tests/soak/groups.py): its own service and fleet.
        self.group_service = f"{self.service}-g"
        self.group_streams = [f"grp:{self.run_id}:{i}" for i in range(settings.group_streams)]
        self.group_fleet: WorkerFleet | None = None
        self.group_producer: GroupProducer | None = None
        self.group_report: GroupReport | None = None
        self.server_spans: list[list[int]] = []  # [start, end] ns of each server fault
        self._group_left: str | None = None  # why the group is not drained yet

    # -- helpers -------------------------------------------------------------------------

    def elapsed(self) -> float:
        return time.monotonic() - self.started_mono

    def say(self, text: str) -> None:
        print(f"[{self.elapsed():7.1f}s] {text}", flush=True)

    def running(self) -> list[Proc]:
        return [p for p in self.procs if p.fate == RUNNING]

    async def _thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await anyio.to_thread.run_sync(fn, *args)

    async def start_worker(self, group: bool = False) -> Proc:
        fleet = self.group_fleet if group else self.fleet
        assert fleet is not None
        while True:
            await self.gate.wait_open()
            url = await self._thread(self.store.worker_url)
            if self.gate.is_open():
                break
        fleet.url = url
        name = f"{'g' if group else 'w'}{self._next_worker}"
        self._next_worker += 1
        if group:
            proc = Proc(fleet.start(name), liveness=SESSION_MODE, group=True)
        else:
            mode = self._next_liveness()
            # The fleet reads its args at each start: this worker's liveness goes last.
            fleet.args = [*self.base_args, "--liveness", mode]
            proc = Proc(fleet.start(name), liveness=mode)
        self.procs.append(proc)
        return proc

    def fleet_of(self, proc: Proc) -> WorkerFleet:
        fleet = self.group_fleet if proc.group else self.fleet
        assert fleet is not None
        return fleet

    def _next_liveness(self) -> str:
        """``--liveness mixed``: the mode fewer live workers run (then fewer started)."""
        if self.s.liveness != MIXED:
            return self.s.liveness
        modes = (LOCK_MODE, SESSION_MODE)
        live = Counter(
            p.liveness for p in self.procs if p.fate in (RUNNING, TERMINATING) and not p.group
        )
        started = Counter(p.liveness for p in self.procs if not p.group)
        return min(modes, key=lambda m: (live[m], started[m]))

    # -- phases --------------------------------------------------------------------------

    async def start(self) -> None:
        s = self.s
        self.say(
            f"soak: target={s.target} seed={s.seed} duration={s.duration_s:g}s "
            f"workers={s.workers} lock_ttl={s.lock_ttl_s:g}s faults={','.join(s.faults)}"
        )
        self.stack.callback(self.side.stop)
        await self._thread(self.side.start)
        self.stack.callback(self.store.stop)
        await self._thread(self.store.start)
        self.say(f"data store: {self.store.describe()}; side server: {self.side.url}")
        self.base_args = [*self.store.worker_args(), *s.worker_args()]
        self.fleet = WorkerFleet(
            self.store.worker_url(),
            self.service,
            TARGET,
            self.base_args,
            pythonpath=[ROOT],
            env={RECORD_URL_ENV: self.side.url},
            cwd=ROOT,
        )
        self.stack.callback(self.fleet.close)
        self._side = Redis.from_url(self.side.url)
        self._data = self.store.client(retries=False)
        self._check = self.store.client(retries=True)
        self._dlq = DeadLetters(self._check, service=self.service)
        for _ in range(s.workers):
            await self.start_worker()
        slow = await self._thread(self.fleet.wait_started, 30.0)
        if s.group_workers:
            self.group_fleet = WorkerFleet(
                self.store.worker_url(),
                self.group_service,
                GROUP_TARGET,
                [*self.base_args, *(a for n in self.group_streams for a in ("--stream", n))],
                pythonpath=[ROOT],
                env={RECORD_URL_ENV: self.side.url},
                cwd=ROOT,
                log_dir=self.fleet.log_dir,
            )
            self.stack.callback(self.group_fleet.close)
            for _ in range(s.group_workers):
                await self.start_worker(group=True)
            slow += await self._thread(self.group_fleet.wait_started, 30.0)
            self.group_producer = GroupProducer(
                self._data,
                self.group_streams,
                s.group_rate,
                s.work_ms,
                random.Random(f"{s.seed}-group"),
            )
        if slow:
            raise RuntimeError(f"workers did not start within 30 s: {[w.name for w in slow]}")
        self.producer = StreamProducer(
            self._data,
            ProducePlan(
                service=self.service,
                run_id=self.run_id,
                rate=s.rate,
                open_streams=s.open_streams,
                entries_per_stream=s.entries_per_stream,
                work_ms=s.work_ms,
                poison_rate=s.poison_rate,
                flaky_rate=s.flaky_rate,
                reject_rate=s.reject_rate,
                cancel_rate=s.cancel_rate,
                finish_rate=s.finish_rate,
                name_pool=s.name_pool,
            ),
            random.Random(f"{s.seed}-produce"),
        )
        self.say(
            f"{s.workers} workers and {s.group_workers} group workers started "
            f"(logs in {self.fleet.log_dir})"
        )

    async def close_clients(self) -> None:
        for client in (self._side, self._data, self._check):
            if client is not None:
                with contextlib.suppress(Exception):
                    await client.aclose()

    async def execute(self) -> int:
        await self.start()
        stop_at = time.monotonic() + self.s.duration_s
        self.phase = "chaos"
        async with anyio.create_task_group() as background:
            background.start_soon(self.monitor_loop)
            background.start_soon(self.progress_loop)
            if self.s.reject_rate > 0:
                background.start_soon(self.replay_loop)
            async with anyio.create_task_group() as followups:
                async with anyio.create_task_group() as active:
                    active.start_soon(self.produce, stop_at)
                    active.start_soon(self.chaos_loop, stop_at, followups)
                self.production_stopped = time.monotonic()
                self.phase = "recovering"
                self.say("faults and production stopped; finishing pending fault actions")
            self.phase = "drain"
            await self.drain()
            background.cancel_scope.cancel()
        await self.stop_fleet()
        return await self.check_and_report()

    async def produce(self, stop_at: float) -> None:
        assert self.producer is not None
        producers = [self.producer.run]
        if self.group_producer is not None:
            producers.append(self.group_producer.run)
        async with anyio.create_task_group() as tg:
            for run in producers:
                tg.start_soon(self._produce, run, stop_at)

    async def _produce(self, run: Callable[[float], Awaitable[None]], stop_at: float) -> None:
        try:
            await run(stop_at)
        except ProducerError as exc:
            self.producer_error = str(exc)
            self.say(f"producer gave up: {exc}")

    # -- faults --------------------------------------------------------------------------

    def eligible(self, kind: str) -> bool:
        running = self.running()
        movable = [p for p in running if not p.stopped]
        if kind == KILL9:
            return bool(running)
        if kind == SIGSTOP:
            return len(movable) >= 2
        if kind == SIGTERM:
            return bool(self._terminable())
        if kind in (SERVER_RESTART, PRIMARY_KILL):
            # A worker still starting up exits when Redis is unreachable (the CLI's
            # start-up PING, the consumer's first commands): wait until all are ready.
            return not self.server_fault_busy and all(p.name in self.ready for p in running)
        return True

    def _terminable(self) -> list[Proc]:
        """Running, not stopped, and ready: before the CLI installed its handlers a
        SIGTERM ends Python at once (-15) instead of stopping the consumer gracefully."""
        return [p for p in self.running() if not p.stopped and p.name in self.ready]

    async def _poll_ready(self) -> None:
        """Workers whose consumer joined the assignment group: start-up is over (it
        read the assignment stream, which comes after its start-up commands)."""
        if all(p.name in self.ready for p in self.running()):
            return
        with contextlib.suppress(Exception):
            consumers = await self._check.xinfo_consumers(self.keys.assignments, self.service)
            self.ready |= {_s(c["name"]) for c in consumers}
        if any(p.group and p.name not in self.ready for p in self.running()):
            # A group worker is past start-up once it joined a stream as a member.
            group_keys = Keys(self.group_service)
            for stream in self.group_streams:
                with contextlib.suppress(Exception):
                    members = await self._check.zrange(group_keys.members(stream), 0, -1)
                    self.ready |= {_s(m).split("~")[0] for m in members}

    async def chaos_loop(self, stop_at: float, followups: anyio.abc.TaskGroup) -> None:
        while True:
            delay = self.rng.uniform(self.s.fault_min_s, self.s.fault_max_s)
            if time.monotonic() + delay >= stop_at:
                return
            await anyio.sleep(delay)
            kinds = [k for k in self.s.faults if self.eligible(k)]
            if not kinds:
                continue
            kind = self.rng.choice(kinds)
            try:
                await self.inject(kind, followups)
            except Exception as exc:
                self.infra_errors.append(f"injecting {kind}: {type(exc).__name__}: {exc}")
                self.say(f"could not inject {kind}: {exc!r}")

    def _record_fault(self, kind: str, text: str) -> None:
        self.faults[kind] += 1
        self.fault_log.append(f"{self.elapsed():7.1f}s {kind}: {text}")
        self.say(f"fault {kind}: {text}")

    async def inject(self, kind: str, followups: anyio.abc.TaskGroup) -> None:
        if kind == KILL9:
            victim = self.rng.choice(self.running())
            victim.fate = KILLED
            victim.worker.kill()
            victim.end_ns = now_ns()
            if victim.stopped:
                victim.stops.append((victim.stops.pop()[0], victim.end_ns))
            self._record_fault(kind, f"SIGKILL {victim.name} (pid {victim.worker.pid})")
            followups.start_soon(self._replace, victim.name, victim.group)
        elif kind == SIGSTOP:
            victim = self.rng.choice([p for p in self.running() if not p.stopped])
            duration = self.s.stop_duration_s(self.rng)
            stopped_at = now_ns()  # before the signal: it lands before anything later
            victim.worker.signal(signal.SIGSTOP)
            victim.stopped = True
            victim.stops.append((stopped_at, 2**62))  # closed by the SIGCONT
            self._record_fault(kind, f"SIGSTOP {victim.name} for {duration:.1f}s")
            followups.start_soon(self._resume_later, victim, duration)
        elif kind == SIGTERM:
            victim = self.rng.choice(self._terminable())
            victim.fate = TERMINATING
            self._record_fault(kind, f"SIGTERM {victim.name} (graceful stop)")
            followups.start_soon(self._terminate, victim)
            followups.start_soon(self._replace, victim.name, victim.group)
        elif kind == CONN_DROP:
            killed = await self._thread(self.store.drop_connections)
            self.dropped_connections += killed
            self._record_fault(kind, f"CLIENT KILL TYPE normal: {killed} connections dropped")
        elif kind == SERVER_RESTART:
            assert isinstance(self.store, StandaloneStore)
            self.server_fault_busy = True
            self.gate.close()  # opened by the follow-up
            down_s = self.rng.uniform(0.2, 1.5)
            try:
                await self._thread(self.store.crash)
            except BaseException:
                self.gate.open()
                self.server_fault_busy = False
                raise
            self.server_spans.append([now_ns(), 2**62])
            self._record_fault(kind, f"SIGKILL redis-server; restart from AOF in {down_s:.1f}s")
            followups.start_soon(self._restart_server, down_s)
        elif kind == PRIMARY_KILL:
            assert isinstance(self.store, ClusterStore)
            self.server_fault_busy = True
            self.gate.close()  # opened by the follow-up once failed over
            try:
                if not await self._thread(self.store.healthy):
                    self.gate.open()
                    self.server_fault_busy = False
                    self.say("primary kill skipped: the cluster is not settled with 6 nodes")
                    return
                primaries = await self._thread(self.store.primary_ports)
                victim_port = self.rng.choice(primaries)
                replica = await self._thread(self.store.crash_primary, victim_port)
            except BaseException:
                self.gate.open()
                self.server_fault_busy = False
                raise
            self.server_spans.append([now_ns(), 2**62])
            self._record_fault(kind, f"SIGKILL primary {victim_port} (replica {replica})")
            followups.start_soon(self._after_primary_kill, victim_port, replica)
        else:  # pragma: no cover - parse_args rejects unknown kinds
            raise ValueError(kind)

    async def _guard(self, what: str, action: Callable[[], Awaitable[None]]) -> None:
        try:
            await action()
        except Exception as exc:
            self.infra_errors.append(f"{what}: {type(exc).__name__}: {exc}")
            self.say(f"{what} failed: {exc!r}")

    async def _replace(self, name: str, group: bool = False) -> None:
        async def go() -> None:
            proc = await self.start_worker(group)
            self.say(f"started {proc.name} to replace {name}")

        await self._guard(f"starting a replacement for {name}", go)

    async def _resume_later(self, victim: Proc, duration: float) -> None:
        await anyio.sleep(duration)
        if victim.stopped and victim.fate in (RUNNING, TERMINATING):
            # The time before the signal: the worker may run (and record a call) before
            # this loop reads the clock again, and the SIGSTOP exception of the
            # exclusive-ownership rule needs its first call to come after this time.
            resumed_at = now_ns()
            victim.worker.signal(signal.SIGCONT)
            victim.stopped = False
            victim.stops.append((victim.stops.pop()[0], resumed_at))
            self.say(f"SIGCONT {victim.name}")

    async def _terminate(self, victim: Proc) -> None:
        code = await self._thread(victim.worker.stop, 30.0)
        victim.end_ns = now_ns()
        victim.fate = TERMINATED
        if code != 0:
            victim.problem = f"exited with status {code} after SIGTERM (expected 0)"
        self.say(f"{victim.name} stopped after SIGTERM with status {code}")

    async def _restart_server(self, down_s: float) -> None:
        assert isinstance(self.store, StandaloneStore)
        store = self.store
        try:
            await anyio.sleep(down_s)

            async def recover() -> None:
                await self._thread(store.recover)

            await self._guard("restarting redis-server from its AOF", recover)
            self.say("redis-server is back (AOF loaded)")
        finally:
            self.gate.open()
            self.server_fault_busy = False
            self._server_fault_over()

    async def _after_primary_kill(self, victim_port: int, replica: int) -> None:
        assert isinstance(self.store, ClusterStore)
        store = self.store
        try:
            try:
                took = await self._thread(store.await_failover, replica)
                self.failover_s.append(took)
                self.say(f"failover: {replica} is primary, cluster settled ({took:.1f}s)")
            except Exception as exc:
                self.infra_errors.append(f"failover to {replica}: {type(exc).__name__}: {exc}")
                self.say(f"failover to {replica} did not complete: {exc!r}")
            finally:
                self.gate.open()
            await anyio.sleep(self.rng.uniform(1.0, 3.0))

            async def restart() -> None:
                await self._thread(store.restart_node, victim_port)
                self.say(f"node {victim_port} restarted (now a replica); cluster is 3+3")

            await self._guard(f"restarting node {victim_port}", restart)
        finally:
            self.server_fault_busy = False
            self._server_fault_over()

    def _server_fault_over(self) -> None:
        """Close the open server-fault span: a session may have lapsed during it, so
        it lasts one TTL past the recovery."""
        if self.server_spans and self.server_spans[-1][1] == 2**62:
            self.server_spans[-1][1] = now_ns() + int(self.s.lock_ttl_s * 1e9)

    # -- monitoring ------------------------------------------------------------------------

    async def monitor_loop(self) -> None:
        """Notice workers that exited without the soak asking; replace them."""
        while True:
            for proc in list(self.procs):
                if proc.fate == RUNNING and not proc.worker.alive():
                    proc.fate = DIED
                    proc.end_ns = now_ns()
                    proc.problem = f"exited on its own with status {proc.worker.returncode}"
                    self.say(f"UNEXPECTED: {proc.name} {proc.problem}")
                    await self._replace(proc.name, proc.group)
            with anyio.move_on_after(2.0):
                await self._poll_ready()
            await anyio.sleep(_MONITOR_S)

    async def progress_loop(self) -> None:
        while True:
            await anyio.sleep(self.s.progress_s)
            with anyio.move_on_after(2.0):
                await self._progress()

    async def _progress(self) -> None:
        handled: Any = "?"
        with contextlib.suppress(Exception):
            handled = int(await self._side.get(HANDLED_KEY) or 0)
        backlog: Any = "?"
        with contextlib.suppress(Exception):
            backlog = int(await self._check.xlen(self.keys.assignments))
        prod = self.producer
        produced = prod.entries if prod else 0
        jobs = len(prod.jobs) if prod else 0
        faults = " ".join(f"{k}={v}" for k, v in sorted(self.faults.items())) or "none"
        running = self.running()
        stopped = sum(1 for p in running if p.stopped)
        workers = f"{len(running)}" + (f" ({stopped} SIGSTOPped)" if stopped else "")
        self.say(
            f"{self.phase}: produced={produced} jobs={jobs} handled={handled} "
            f"replayed={len(self.replays)} assignments_queued={backlog} workers={workers} "
            f"faults: {faults}"
        )

    # -- dead-letter replays ----------------------------------------------------------------

    async def replay_loop(self) -> None:
        """Put the handler's rejects back every ``--replay-every-s``, faults or not."""
        while True:
            await anyio.sleep(self.s.replay_every_s)
            await self.replay_round()

    async def replay_round(self) -> int:
        """Replay every dead letter the handler rejected (``DeadLetterFilter`` by its
        reason text); log what went where. Returns how many it found (-1: the round failed)."""
        assert self._dlq is not None
        selection = DeadLetterFilter(reason=REJECT_REASON)
        async with self._replay_lock:
            t0 = now_ns()
            try:
                letters = await self._dlq.select(selection)
            except Exception as exc:
                self.replay_errors[type(exc).__name__] += 1
                return -1
            if not letters:
                return 0
            # A replay that queues a new job gives it the info of the first dead letter
            # of its stream: that is the job it runs under.
            first_job: dict[str, str] = {}
            for r in letters:
                first_job.setdefault(r.source_stream, str(r.info.get("job", "")))
            try:
                report = await self._dlq.replay([r.id for r in letters])
            except Exception as exc:
                self.replay_errors[type(exc).__name__] += 1
                await self._after_failed_replay(letters, first_job, t0)
                return -1
            t1 = now_ns()
            by_id = {r.id: r for r in letters}
            for done in report.replayed:
                letter = by_id[done.dead_letter_id]
                self._log_replay(letter, first_job, done.new_id, done.reassigned, t0, t1)
            if report.replayed:
                self.replay_rounds += 1
            self.replay_skipped += len(report.skipped)
            return len(letters)

    def _log_replay(
        self,
        letter: DeadLetterRecord,
        first_job: dict[str, str],
        new_id: str,
        reassigned: bool,
        t0: int,
        t1: int,
    ) -> None:
        self.replayed_reasons[letter.reason.value if letter.reason else "?"] += 1
        self.replays.append(
            Replay(
                stream=letter.source_stream,
                origin_id=letter.fields.get("_replayed_from") or letter.source_id,
                new_id=new_id,
                job=first_job[letter.source_stream],
                reassigned=reassigned,
                start_ns=t0,
                end_ns=t1,
            )
        )

    async def _after_failed_replay(
        self, letters: list[DeadLetterRecord], first_job: dict[str, str], t0: int
    ) -> None:
        """A replay call failed midway: the dead letters it removed were put back (a
        replay removes a dead letter only once its entry is in place). Log those with
        what is known: no copy id (the streams, read at the end, tell), and "may have
        queued a new job" (the rerun rule's excuse)."""
        with anyio.move_on_after(10.0):
            while True:
                try:
                    assert self._dlq is not None
                    selection = DeadLetterFilter(reason=REJECT_REASON)
                    remaining = {r.id for r in await self._dlq.select(selection)}
                    break
                except Exception:
                    await anyio.sleep(0.5)
            t1 = now_ns()
            for letter in letters:
                if letter.id not in remaining:
                    self._log_replay(letter, first_job, "", True, t0, t1)

    # -- drain and stop --------------------------------------------------------------------

    async def drain(self) -> None:
        """Wait until every assignment is finished (or dead-lettered), no lock is left
        and no rejected dead letter waits for its replay (replayed here until none)."""
        started = self.production_stopped or time.monotonic()
        deadline = time.monotonic() + self.s.drain_timeout_s
        last = "not checked yet"
        while time.monotonic() < deadline:
            try:
                queued = int(await self._check.xlen(self.keys.assignments))
                locks = await self._thread(self.store.keys_matching, self.keys.lock_pattern)
                # After those reads: with no job left, no reject can be dead-lettered
                # once this round found none.
                rejects = await self.replay_round() if self.s.reject_rate > 0 else 0
                group_done = queued == 0 and not locks and await self._group_drained()
                if rejects != 0:
                    last = f"{queued} assignments queued, {len(locks)} locks held, " + (
                        "rejected dead letters unknown" if rejects < 0 else "replaying rejects"
                    )
                elif queued == 0 and not locks and group_done:
                    self.drain_s = time.monotonic() - started
                    self.say(f"drained {self.drain_s:.1f}s after production stopped")
                    return
                last = f"{queued} assignments queued, {len(locks)} locks held"
                if queued == 0 and not locks and not group_done:
                    last = f"shared group: {self._group_left}"
                if time.monotonic() - started > _DRAIN_PATIENCE_S and await self._only_reruns():
                    self.drain_problem = (
                        f"not drained: the {queued} assignments still queued name streams "
                        "that had already finished (they wait for entries forever)"
                    )
                    self.say(self.drain_problem)
                    return
            except Exception as exc:
                last = f"{type(exc).__name__}: {exc}"
            await anyio.sleep(0.5)
        self.drain_problem = f"not drained within {self.s.drain_timeout_s:g}s ({last})"
        self.say(self.drain_problem)

    async def _group_drained(self) -> bool:
        """The shared group's streams are delivered to the end, nothing pending."""
        if self.group_fleet is None:
            return True
        self._group_left = await drained(self._check, self.group_service, self.group_streams)
        return self._group_left is None

    async def _only_reruns(self) -> bool:
        """Every queued assignment names a job some worker already ended (by its stream
        and the job in its info), and no replay queued that job again."""
        queued = await self._check.xrange(self.keys.assignments)
        if not queued:
            return False
        raw = await self._side.lrange(EVENTS_KEY, 0, -1)
        history = parse(r.decode() for r in raw)
        ended = {(ep.stream, ep.job) for ep in history.episodes.values() if ep.ended}
        replayed = {(r.stream, r.job) for r in self.replays if r.reassigned}
        for _, fields in queued:
            key = (_s(fields.get(b"stream", b"")), _info_job(fields.get(b"info", b"{}")))
            if key not in ended or key in replayed:
                return False
        return True

    async def stop_fleet(self) -> None:
        assert self.fleet is not None
        self.phase = "stopping"
        live = [p for p in self.procs if p.fate == RUNNING]
        # A replacement may still be starting: SIGTERM before its handlers are installed
        # would end it with -15 rather than a graceful stop.
        deadline = time.monotonic() + 30.0
        while time.monotonic() < deadline:
            if all(self.fleet_of(p).started(p.worker) or not p.worker.alive() for p in live):
                break
            await anyio.sleep(0.1)
        for proc in live:
            if not proc.worker.alive():
                proc.fate = DIED
                proc.end_ns = now_ns()
                proc.problem = f"exited on its own with status {proc.worker.returncode}"
            elif not self.fleet_of(proc).started(proc.worker):
                proc.problem = "had not started 30 s after it was spawned"
        live = [p for p in live if p.fate == RUNNING]
        stragglers: set[str] = set()

        async def stop(fleet: WorkerFleet) -> None:
            stragglers.update(await self._thread(fleet.stop_all, 30.0))

        async with anyio.create_task_group() as tg:  # both fleets at once
            for fleet in (self.fleet, self.group_fleet):
                if fleet is not None:
                    tg.start_soon(stop, fleet)
        end = now_ns()
        for proc in live:
            proc.fate = FINAL
            proc.end_ns = end
            code = proc.worker.returncode
            if proc.name in stragglers:
                proc.problem = "did not stop within 30 s of SIGTERM at the end (SIGKILLed)"
            elif code != 0:
                proc.problem = f"exited with status {code} at the final graceful stop"
        self.say(f"fleet stopped ({len(live)} workers)")

    # -- checks ----------------------------------------------------------------------------

    async def check_and_report(self) -> int:
        state = await self.collect()
        report = build_report(self, state)
        print(report.text, flush=True)
        return 0 if report.passed else 1

    async def collect(self) -> State:
        assert self.producer is not None
        raw = await self._side.lrange(EVENTS_KEY, 0, -1)
        history = parse(r.decode() for r in raw)
        history.resolve(
            {p.name: p.end_ns for p in self.procs if p.end_ns is not None}, fallback_end_ns=now_ns()
        )
        self.records = [r.decode() for r in raw]
        c = self._check
        dlq = await c.xrange(self.keys.dead_letters)
        in_stream: dict[str, set[str]] = {}
        data_pending: dict[str, int] = {}
        pending_detail: dict[str, str] = {}
        no_retention: list[str] = []
        copies: list[tuple[str, str, str]] = []
        for name in sorted(self.producer.names):
            entries = await c.xrange(name)
            # The producer's entries: not end markers, not copies a replay put back.
            in_stream[name] = {
                _s(i) for i, f in entries if b"_eos" not in f and b"_replayed_from" not in f
            }
            copies += [
                (name, _s(f[b"_replayed_from"]), _s(i))
                for i, f in entries
                if b"_replayed_from" in f
            ]
            if int(await c.pttl(name)) == -1:
                no_retention.append(name)
            try:
                data_pending[name] = int((await c.xpending(name, self.service))["pending"])
            except Exception:
                data_pending[name] = 0  # no group: never acquired (counted as lost anyway)
            if data_pending[name]:
                rows = await c.xpending_range(name, self.service, "-", "+", 1000)
                by_consumer = Counter(_s(r["consumer"]) for r in rows)
                ids = [_s(r["message_id"]) for r in rows]
                pending_detail[name] = (
                    f"{', '.join(f'{k}: {v}' for k, v in by_consumer.items())}; "
                    f"ids {ids[0]} .. {ids[-1]}"
                )
        if self.group_producer is not None:
            group_records = [r.decode() for r in await self._side.lrange(GROUP_EVENTS_KEY, 0, -1)]
            self.records += group_records
            # A member of a worker killed just before the end lives out its session TTL.
            await until_no_member_alive(
                c, self.group_service, self.group_streams, self.s.lock_ttl_s + 1.0
            )
            group_state = await collect_groups(
                c, self.group_service, self.group_streams, group_records
            )
            windows = Windows(
                stops={p.name: p.stops for p in self.procs},
                ends={p.name: p.end_ns for p in self.procs if p.end_ns is not None},
                server_faults=[(a, b) for a, b in self.server_spans],
            )
            self.group_report = check_groups(self.group_producer.produced, group_state, windows)
        return State(
            history=history,
            dlq=[(_s(i), {_s(k): _s(v) for k, v in f.items()}) for i, f in dlq],
            in_stream=in_stream,
            data_pending=data_pending,
            lbs_len=int(await c.xlen(self.keys.assignments)),
            lbs_pending=int((await c.xpending(self.keys.assignments, self.service))["pending"]),
            leases=int(await c.zcard(self.keys.leases)),
            lease_members=await self._lease_members(),
            active=int(await c.hlen(self.keys.active)),
            locks=await self._thread(self.store.keys_matching, self.keys.lock_pattern),
            pending_detail=pending_detail,
            no_retention=no_retention,
            copies=copies,
        )

    async def _lease_members(self) -> list[tuple[str, float, bool]]:
        """(assignment id, seconds to its deadline, whether the assignment exists) of
        every lease member left."""
        c = self._check
        members = await c.zrange(self.keys.leases, 0, -1, withscores=True)
        seconds, micros = await c.time()
        now_ms = int(seconds) * 1000 + int(micros) // 1000
        out = []
        for member, score in members:
            aid = _s(member)
            exists = bool(await c.xrange(self.keys.assignments, aid, aid))
            out.append((aid, (float(score) - now_ms) / 1000, exists))
        return out

    def keep_logs(self) -> None:
        dest = self.s.keep_logs
        if dest is None or self.fleet is None:
            return
        dest.mkdir(parents=True, exist_ok=True)
        for proc in self.procs:
            with contextlib.suppress(OSError):
                shutil.copy(proc.worker.log, dest / f"{proc.name}.log")
        (dest / "store.log").write_text(self.store.log_tails(100_000))
        (dest / "faults.log").write_text("\n".join(self.fault_log) + "\n")
        (dest / "records.txt").write_text("\n".join(self.records) + "\n")
        if self.producer is not None:
            (dest / "jobs.txt").write_text(
                "".join(
                    f"job {_describe_job(j)}; {j.name} assignment {j.assignment_id} floor "
                    f"{j.floor_id} end_at {j.end_at} tail {j.tail} reason {j.cancel_reason!r}"
                    f" finish {j.finish_id or '-'} eos {j.eos_id or '-'}; entries "
                    + " ".join(
                        f"{eid}:{seq}{':' + kind if kind else ''}" for eid, seq, kind in j.entries
                    )
                    + "\n"
                    for j in self.producer.jobs.values()
                )
            )
        (dest / "replays.txt").write_text("".join(f"{r}\n" for r in self.replays))


def _s(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _info_job(raw: Any) -> str:
    """The job an assignment's (or a dead letter's) ``info`` JSON names ('' if none)."""
    try:
        info = json.loads(_s(raw))
    except ValueError:
        return ""
    return str(info.get("job", "")) if isinstance(info, dict) else ""


@dataclass
class State:
    """What the checks read at the end."""

    history: History
    dlq: list[tuple[str, dict[str, str]]]
    in_stream: dict[str, set[str]]
    data_pending: dict[str, int]
    lbs_len: int
    lbs_pending: int
    leases: int
    active: int  # fields of the active-assignment index (add_stream's dedupe)
    locks: list[str]
    pending_detail: dict[str, str]  # stream -> pending entries by consumer
    no_retention: list[str]  # streams without a TTL (finished_stream_ttl_s not applied)
    copies: list[tuple[str, str, str]] = field(default_factory=list)
    lease_members: list[tuple[str, float, bool]] = field(default_factory=list)
    """(assignment id, seconds to its deadline, whether the assignment exists)."""
    """(stream, original id, copy id) of every replayed copy found in the streams."""


# -- the report ------------------------------------------------------------------------------


@dataclass
class Report:
    text: str
    passed: bool


def describe_stream(history: History, stream: str) -> list[str]:
    """One line per ownership episode of ``stream``: who, when, how many calls, how it ended."""
    out = []
    for ep in sorted(
        (e for e in history.episodes.values() if e.stream == stream), key=lambda e: e.begin_ns
    ):
        last = ep.calls[-1].describe() if ep.calls else "no calls"
        ok = sum(1 for c in ep.calls if c.status == "ok")
        flags = ", ".join(f for f, on in (("lost", ep.lost), ("ended", ep.ended)) if on) or "-"
        out.append(
            f"episode {ep.id} began {time.strftime('%H:%M:%S', time.localtime(ep.begin_ns / 1e9))}"
            f".{ep.begin_ns // 1_000_000 % 1000:03d}: {len(ep.calls)} calls ({ok} ok), "
            f"hooks: {flags}; last: {last}"
        )
    return out


def _log_errors(worker: Worker) -> list[str]:
    lines = worker.output().splitlines()
    return [ln for ln in lines if " ERROR " in ln or ln.startswith("Traceback")]


def _row(label: str, value: str) -> str:
    return f"{label:<17}  {value}"


def build_report(soak: Soak, st: State) -> Report:
    s = soak.s
    prod = soak.producer
    assert prod is not None
    lbs = soak.keys.assignments
    failures: list[str] = []
    failed: list[str] = []  # the categories of the failed checks (summary line)
    relevant: set[str] = set()
    lines: list[str] = []
    jobs = list(prod.jobs.values())

    # Produced: what the producer wrote (each exactly once), and what the streams hold.
    acked = {(j.name, eid) for j in jobs for eid, _, _ in j.entries}
    kinds = {(j.name, eid): kind for j in jobs for eid, _, kind in j.entries}
    present = {(name, eid) for name, ids in st.in_stream.items() for eid in ids}
    vanished = acked - present
    extra = present - acked

    left: Counter[str] = Counter()  # dead letters by reason, at the end
    dead_entries: dict[tuple[str, str], str] = {}
    dead_count: Counter[tuple[str, str]] = Counter()
    abandoned_jobs: set[int] = set()
    abandoned_names: set[str] = set()
    for _, fields in st.dlq:
        reason = fields.get("_dlq_reason", "?")
        left[reason] += 1
        source = fields.get("_source_stream", "")
        if source == lbs:
            abandoned_names.add(fields.get("stream", "?"))
            job = _info_job(fields.get("info", "{}"))
            if job.isdigit():
                abandoned_jobs.add(int(job))
        else:
            key = (source, fields.get("_replayed_from") or fields.get("_source_id", ""))
            dead_entries[key] = reason
            dead_count[key] += 1
    written = left + soak.replayed_reasons  # every dead letter of the run
    duplicate_dead_letters = sum(n - 1 for n in dead_count.values() if n > 1)
    wrong_dead = [
        f"{a} {b} ({reason}, a {kinds.get((a, b)) or 'plain'} entry)"
        for (a, b), reason in dead_entries.items()
        if {"handler_failed": POISON, "rejected": REJECT}.get(reason) != kinds.get((a, b))
    ] + [
        f"{r.stream} {r.origin_id} (rejected and replayed, a {kinds.get(k) or 'plain'} entry)"
        for r in soak.replays
        if kinds.get(k := (r.stream, r.origin_id)) != REJECT
    ]

    # Where each replayed copy went: the log, completed from the streams (a replay
    # call that failed midway may have put some back).
    logged = {(r.stream, r.origin_id, r.new_id) for r in soak.replays}
    copies = [r for r in soak.replays if r.new_id] + [
        Replay(stream, origin, new_id, "")
        for stream, origin, new_id in st.copies
        if (stream, origin, new_id) not in logged
    ]
    acc = account((j.record() for j in jobs), st.history, dead_entries, abandoned_jobs, copies)
    foreign = foreign_calls(st.history)
    foreign_entries = {(c.stream, c.entry_id) for c in foreign}
    foreign_copies = {(c.stream, c.entry_id) for c in foreign if c.replayed_from}
    exclusive: ExclusiveReport = check_exclusive(st.history, {p.name: p.stops for p in soak.procs})
    order = check_order(st.history)
    rerun = restarted_after_finish(st.history, soak.replays)

    # -- checks --
    if soak.producer_error:
        failures.append(f"the producer gave up: {soak.producer_error}")
        failed.append("producer")
    if soak.drain_problem:
        failures.append(soak.drain_problem)
        failed.append("drain")
    # Failures a replay causes (README.md, defects 4 and 6) are their own categories,
    # so that a run tells them from every other: a replayed copy handed to another job,
    # an entry appended after an early end of a job that a replay then ran again, and
    # what follows on that name from the job that got such an entry.
    replayed_jobs = rerun_jobs(soak.replays)
    tail_keys = {(j.name, eid) for j in jobs for eid, _, k in j.entries if k == TAIL}
    past_end = [c for c in st.history.calls if c.status == "ok" and c.origin in tail_keys]
    tainted = replay_tainted(foreign, tail_keys, replayed_jobs)

    def by_replay(call: Call) -> bool:
        caused = replay_caused(call, tail_keys, replayed_jobs)
        return caused or downstream(call.stream, call.info_job, tainted)

    lost_by_replay = [
        text in acc.lost_copies or downstream(stream, str(n), tainted)
        for text, (stream, n) in zip(acc.lost, acc.lost_at, strict=True)
    ]
    if acc.lost:
        # What a replay caused is its own category (see below and README.md).
        if not all(lost_by_replay):
            failed.append("lost")
        if any(lost_by_replay):
            failed.append("lost_replay")
        failures.append(
            f"{len(acc.lost)} entries lost (produced, neither handled nor excused): "
            + "; ".join(acc.lost[:10])
            + (" ..." if len(acc.lost) > 10 else "")
        )
        lost_vanished = [t for t in acc.lost if tuple(t.split(" ")[:2]) in vanished]
        if lost_vanished:
            failures.append(
                f"  of which {len(lost_vanished)} are missing from their stream in Redis "
                "(acknowledged to the producer, then gone: a write lost by the server)"
            )
    if foreign:
        if any(not by_replay(c) for c in foreign):
            failed.append("foreign")
        if any(by_replay(c) for c in foreign):
            failed.append("foreign_replay")
        failures.append(
            f"{len(foreign_entries)} foreign entries (handed to a job they do not belong "
            f"to; {len(foreign)} calls; {len(foreign_copies)} of the entries are replayed copies):"
        )
        for call in foreign[:10]:
            copy = f", a replayed copy of {call.replayed_from}" if call.replayed_from else ""
            if not copy and replay_caused(call, tail_keys, replayed_jobs):
                copy = ", appended after its job ended early, which a replay then ran again"
            elif not copy and by_replay(call):
                copy = ", after a replay's rerun shifted the jobs of this name"
            failures.append(
                f"  {call.describe()}: entry of job {call.entry_job or '?'} handed to job "
                f"{call.info_job or '?'}{copy}"
            )
            relevant.add(call.consumer)
    if acc.past_end:
        if any(not by_replay(c) for c in past_end):
            failed.append("past_end")
        if any(by_replay(c) for c in past_end):
            failed.append("past_end_replay")
        failures.append(
            f"{len(acc.past_end)} entries appended after their job's end (a cancel, a "
            "finish entry) were handled: " + "; ".join(acc.past_end[:10])
        )
    if left.get("rejected"):
        failed.append("unreplayed")
        failures.append(
            f"{left['rejected']} rejected dead letters are left after the drain (every one "
            "is replayed until none remain)"
        )
    if exclusive.violations:
        failed.append("exclusive")
        failures.append(
            f"{exclusive.violations} exclusive-ownership violations (stale calls "
            f"{len(exclusive.stale_calls)}, "
            f"unexcused overlaps {len(exclusive.unexcused_overlaps)}, "
            f"overlaps within one episode {len(exclusive.same_episode_overlaps)})"
        )
        for text in (
            exclusive.stale_calls + exclusive.unexcused_overlaps + exclusive.same_episode_overlaps
        )[:10]:
            failures.append(f"  {text}")
        relevant |= exclusive.offenders
    if rerun:
        failed.append("rerun_finished")
        failures.append(
            f"{len(rerun)} jobs were started again after they had finished (a second run "
            "of a finished job: it waits for entries forever)"
        )
        for label, lines_ in list(rerun.items())[:5]:
            name = label.split(" job ")[0]
            failures.append(f"  {label}: {'; '.join(lines_)}")
            failures.extend(f"    {line}" for line in describe_stream(st.history, name))
            relevant |= {ep.consumer for ep in st.history.episodes.values() if ep.stream == name}
    if order:
        failed.append("order")
        failures.append(f"{len(order)} order violations within an episode")
        failures.extend(f"  {t}" for t in order[:5])
    if wrong_dead:
        failed.append("dead_letters")
        failures.append(
            f"{len(wrong_dead)} entries dead-lettered for the wrong reason (only poison "
            "entries fail every attempt, only reject entries are rejected): "
            + ", ".join(wrong_dead[:5])
        )
    if acc.unknown:
        failed.append("unknown_entries")
        failures.append(
            f"{len(acc.unknown)} handled entries were never produced: "
            + ", ".join(f"{a} {b}" for a, b in acc.unknown[:5])
        )
    if st.history.unmatched_exits:
        failed.append("records")
        failures.append(f"{st.history.unmatched_exits} exit records without an enter record")
    leftovers = []
    if st.locks:
        leftovers.append(f"{len(st.locks)} lock keys ({', '.join(st.locks[:5])})")
    if st.lbs_len:
        leftovers.append(f"{st.lbs_len} assignments left in the assignment stream")
    if st.lbs_pending:
        leftovers.append(f"{st.lbs_pending} pending assignments")
    if st.leases:
        leftovers.append(
            f"{st.leases} lease members ("
            + ", ".join(
                f"{aid}: due in {due:.0f}s, assignment {'exists' if there else 'gone'}"
                for aid, due, there in st.lease_members[:5]
            )
            + ")"
        )
    # Lease members of assignments that are gone are their own category (README.md,
    # defect 7: an owner stalled before recording its lease records it after its job was
    # recovered and finished elsewhere).
    stale_leases = [m for m in st.lease_members if not m[2]]
    if st.active:
        leftovers.append(f"{st.active} active-assignment index entries")
    pending_streams = {n: c for n, c in st.data_pending.items() if c and n not in abandoned_names}
    if pending_streams:
        leftovers.append(
            f"pending entries in {len(pending_streams)} data streams "
            f"({', '.join(f'{n}={c}' for n, c in list(pending_streams.items())[:5])})"
        )
    no_retention = [n for n in st.no_retention if n not in abandoned_names]
    if no_retention:
        leftovers.append(
            f"{len(no_retention)} finished data streams without their retention TTL "
            f"({', '.join(no_retention[:5])})"
        )
    if st.locks or st.lbs_len or st.lbs_pending or st.leases > len(stale_leases) or st.active:
        failed.append("left_behind_keys")
    if stale_leases:
        failed.append("stale_lease")
    if pending_streams or no_retention:
        # Data streams of finished assignments keep pending entries or lack their
        # retention TTL: the release after finish never ran (see README.md).
        failed.append("left_behind_data")
    if leftovers:
        failures.append("left behind: " + "; ".join(leftovers))
        for name in list(pending_streams)[:5]:
            failures.append(f"  {name}: pending {st.pending_detail.get(name, '?')}")
            failures.extend(f"    {line}" for line in describe_stream(st.history, name))
            relevant |= {ep.consumer for ep in st.history.episodes.values() if ep.stream == name}
        for name in no_retention[:3]:
            last = max((j for j in jobs if j.name == name), key=lambda j: j.n, default=None)
            if last is not None:
                failures.append(f"  {name}: last job {_describe_job(last)}")
    for proc in soak.procs:
        if proc.problem:
            failures.append(f"worker {proc.name}: {proc.problem}")
            relevant.add(proc.name)
            if "processes" not in failed:
                failed.append("processes")
    if soak.infra_errors:
        failed.append("infrastructure")
        failures.extend(f"soak infrastructure: {e}" for e in soak.infra_errors)

    # -- figures --
    fault_text = " ".join(f"{k}={soak.faults.get(k, 0)}" for k in s.faults)
    calls = len(st.history.calls)
    statuses = Counter(c.status or "no exit" for c in st.history.calls)
    fates = Counter(p.fate for p in soak.procs)
    modes = Counter(p.liveness for p in soak.procs if not p.group)
    log_errors = {p.name: _log_errors(p.worker) for p in soak.procs}
    error_lines = sum(len(v) for v in log_errors.values())
    entry_kinds = Counter(kinds.values())
    names = prod.names
    cancels = [j for j in jobs if j.cancel_outcome]
    outcomes = Counter(j.cancel_outcome for j in cancels)
    finishes = [j for j in jobs if j.finish_id]
    tails = [j for j in jobs if any(k == TAIL for _, _, k in j.entries)]
    closed_after = sum(1 for j in jobs if j.fate in (CANCEL, EARLY_FINISH) and j.closed)
    hooks = Counter(
        "cancelled" if ep.cancelled else "ended" for ep in st.history.episodes.values() if ep.ended
    )
    new_jobs = len({(r.stream, r.start_ns) for r in soak.replays if r.reassigned})
    group = soak.group_report
    if group is not None:
        failures.extend(group.failures)
        failed.extend(group.failed)
        if group.failed:
            relevant |= {p.name for p in soak.procs if p.group}
    passed = not failures
    reasons_text = ", ".join(f"{r}={n}" for r, n in sorted(written.items())) or "none"
    left_text = ", ".join(f"{r}={n}" for r, n in sorted(left.items())) or "none"
    lines.append("")
    lines.append(f"== soak report: target={s.target} seed={s.seed} duration={s.duration_s:g}s ==")
    lines.append(
        _row(
            "target",
            f"{s.target}, {s.duration_s:g}s of faults and production"
            + (f", drained {soak.drain_s:.1f}s later" if soak.drain_s is not None else "")
            + f"; mix {','.join(s.mix) or 'none'}",
        )
    )
    lines.append(
        _row(
            "workers",
            f"{len(soak.procs)} processes: LOCK {modes.get(LOCK_MODE, 0)}, SESSION "
            f"{modes.get(SESSION_MODE, 0)}, GroupConsumer {sum(p.group for p in soak.procs)} ("
            + ", ".join(f"{fate} {n}" for fate, n in sorted(fates.items()))
            + f"); ERROR/Traceback log lines {error_lines}",
        )
    )
    lines.append(
        _row(
            "jobs",
            f"{len(jobs)}: closed {sum(1 for j in jobs if j.fate not in (CANCEL, EARLY_FINISH))}"
            f", cancelled {len(cancels)}, finished early {len(finishes)}; add_stream "
            f"deduplicated {prod.deduplicated} ({prod.dedup_same_id} with the previous job's id)",
        )
    )
    lines.append(
        _row("stream names", f"{len(names)} distinct, reused {len(jobs) - len(names)} times")
    )
    lines.append(
        _row(
            "entries produced",
            f"{len(acked)} (poison {entry_kinds[POISON]}, flaky {entry_kinds['flaky']}, "
            f"reject {entry_kinds[REJECT]}, finish {entry_kinds[FINISH]}, after an end "
            f"{entry_kinds[TAIL]}); write errors {sum(prod.errors.values())}"
            + (f" {dict(prod.errors)}" if prod.errors else "")
            + f", confirmed after an error {prod.confirmed_after_error}",
        )
    )
    lines.append(
        _row(
            "entries handled",
            f"{acc.handled} distinct; skipped after a cancel/finish {acc.skipped}; calls "
            f"{calls} ({', '.join(f'{k} {v}' for k, v in sorted(statuses.items()))})",
        )
    )
    lines.append(
        _row(
            "duplicates",
            f"{acc.duplicates} (entries handled more than once: {acc.duplicated_entries})",
        )
    )
    lines.append(
        _row(
            "dead letters",
            f"{sum(written.values())}: {reasons_text}; left at the end: {left_text}"
            + (
                f" (duplicate dead letters {duplicate_dead_letters})"
                if duplicate_dead_letters
                else ""
            )
            + (
                f"; jobs abandoned by recovery {len(abandoned_jobs)} ({acc.abandoned} entries)"
                if abandoned_jobs
                else ""
            ),
        )
    )
    lines.append(
        _row(
            "replays",
            f"{len(soak.replays)} dead letters put back in {soak.replay_rounds} rounds (new "
            f"jobs {new_jobs}, left for later {soak.replay_skipped}"
            + (f", failed rounds {dict(soak.replay_errors)}" if soak.replay_errors else "")
            + f"); reject entries handled once replayed {acc.rejects_handled}/{acc.rejects}",
        )
    )
    lines.append(
        _row(
            "cancels",
            f"{len(cancels)} ("
            + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items()))
            + f"; empty reason {sum(1 for j in cancels if not j.cancel_reason)}); "
            f"on_stream_cancelled {hooks['cancelled']}",
        )
    )
    lines.append(
        _row(
            "early finishes",
            f"{len(finishes)}; jobs with entries after their end {len(tails)}, closed after "
            f"their end {closed_after}; on_stream_end {hooks['ended']}",
        )
    )
    lines.append(
        _row(
            "faults",
            f"{fault_text} (total {sum(soak.faults.values())}; connections dropped "
            f"{soak.dropped_connections}"
            + (
                f"; failovers {', '.join(f'{x:.1f}s' for x in soak.failover_s)}"
                if soak.failover_s
                else ""
            )
            + ")",
        )
    )
    lines.append(
        _row(
            "foreign entries",
            f"{len(foreign_entries)}"
            + (
                f" ({len(foreign)} calls; {len(foreign_copies)} of them are replayed copies)"
                if foreign
                else ""
            ),
        )
    )
    lines.append(_row("lost", f"{len(acc.lost)}"))
    lines.append(_row("handled past end", f"{len(acc.past_end)}"))
    if vanished or extra:
        lines.append(
            _row(
                "redis anomalies", f"vanished writes {len(vanished)}, unknown entries {len(extra)}"
            )
        )
    lines.append(
        _row(
            "exclusive owner",
            f"violations {exclusive.violations}; excused: {len(exclusive.excused_calls)} "
            f"in-flight calls of disowned consumers, overlapping {exclusive.excused_overlaps} "
            "calls of later owners",
        )
    )
    lines.append(_row("order", f"violations {len(order)}"))
    lines.append(_row("finished jobs", f"started again {len(rerun)}"))
    lines.append(
        _row(
            "left behind",
            f"locks {len(st.locks)}, queued assignments {st.lbs_len}, pending assignments "
            f"{st.lbs_pending}, lease members {st.leases}, active index entries {st.active}, "
            f"streams with pending entries {len(pending_streams)}, finished streams without "
            f"retention {len(no_retention)}",
        )
    )
    if group is not None:
        lines.extend(group.lines)
        gp = soak.group_producer
        if gp is not None and gp.errors:
            lines.append(
                _row(
                    "group writes",
                    f"errors {dict(gp.errors)}, confirmed after an error "
                    f"{gp.confirmed_after_error}",
                )
            )
    if error_lines:
        lines.append("worker log errors (first of each worker):")
        for name, errs in log_errors.items():
            if errs:
                lines.append(f"  {name}: {len(errs)} lines, first: {errs[0][:200]}")
    if not passed:
        lines.append("")
        lines.append("FAILED CHECKS:")
        lines.extend(f"- {f}" for f in failures)
        if not relevant:
            relevant = {n for n, errs in log_errors.items() if errs}
        if not relevant:  # nothing points at a worker: show the last fleet
            relevant = {p.name for p in soak.procs if p.fate == FINAL}
        for proc in soak.procs:
            if proc.name in relevant:
                lines.append(
                    f"--- log tail of {proc.name} ({proc.fate}, exit {proc.worker.returncode}) ---"
                )
                lines.append(proc.worker.log_tail(_LOG_TAIL_LINES))
        if soak.drain_problem or soak.infra_errors:
            lines.append(soak.store.log_tails(15))
        lines.append("fault log:")
        lines.extend(f"  {t}" for t in soak.fault_log)
    lines.append(
        f"summary: target={s.target} seed={s.seed} jobs={len(jobs)} names={len(names)} "
        f"entries={len(acked)} handled={acc.handled} duplicates={acc.duplicates} "
        f"dead_letters={sum(written.values())} foreign={len(foreign_entries)} "
        f"lost={len(acc.lost)} overlaps={exclusive.violations} "
        f"faults={sum(soak.faults.values())} result={'PASS' if passed else 'FAIL'}"
        + (f" failed={','.join(failed)}" if failed else "")
    )
    return Report("\n".join(lines), passed)


def _describe_job(job: Any) -> str:
    ends = {CANCEL: f"cancelled ({job.cancel_outcome})", EARLY_FINISH: "finished early"}
    return f"{job.n}: {len(job.entries)} entries, {ends.get(job.fate, 'closed')}" + (
        ", closed" if job.closed else ", not closed"
    )


# -- entry point -----------------------------------------------------------------------------


async def _run(settings: Settings, stack: contextlib.ExitStack) -> int:
    soak = Soak(settings, stack)
    interrupted = False
    code = 1
    try:
        async with anyio.create_task_group() as tg:

            async def watch_signals() -> None:
                nonlocal interrupted
                with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                    async for signum in signals:
                        interrupted = True
                        print(f"\n{signal.Signals(signum).name}: stopping", flush=True)
                        tg.cancel_scope.cancel()
                        return

            async def main() -> None:
                nonlocal code
                try:
                    code = await soak.execute()
                except Exception as exc:
                    print(f"soak: error: {type(exc).__name__}: {exc}", flush=True)
                    traceback.print_exc()
                    for proc in soak.procs:
                        print(f"--- log tail of {proc.name} ---\n{proc.worker.log_tail(20)}")
                    code = 1
                finally:
                    tg.cancel_scope.cancel()

            tg.start_soon(watch_signals)
            tg.start_soon(main)
    finally:
        with anyio.CancelScope(shield=True):
            await soak.close_clients()
        soak.keep_logs()
    if interrupted:
        print("interrupted: every process this run started is being stopped", flush=True)
        return _EXIT_INTERRUPTED
    return code


def main(argv: Sequence[str] | None = None) -> int:
    settings = parse_args(argv)
    with contextlib.ExitStack() as stack:
        try:
            return anyio.run(_run, settings, stack)
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return _EXIT_INTERRUPTED
        finally:
            # The ExitStack stops the fleet, the data store and the side server (in that
            # order) and removes their directories, whatever happened above.
            print("cleaning up: stopping workers and servers", flush=True)
