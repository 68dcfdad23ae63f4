"""Two workers, a producer and a kill -9: the fleet still finishes every album.

    python examples/fleet/run.py [REDIS_URL]

What the README does by hand, in one script:

1. starts two workers, ``w1`` and ``w2``, with the CLI (this folder on their
   ``PYTHONPATH``, the URL in ``STREAMJOBS_REDIS_URL``)::

       python -m streamjobs worker handlers:Resizer --service S --consumer-name w1 \\
           --lock-ttl 2 --concurrency 3

   and waits until both have logged ``consumer wN of service S started``;
2. runs ``producer.py``: 6 albums of 20 images, 50 ms of work each;
3. once ``w1`` owns albums and has resized a few images, kills it with SIGKILL: no
   hand-back, its locks stay until their TTL (2 s) runs out;
4. ``w2`` resumes ``w1``'s albums where they stopped (an image ``w1`` was resizing
   when it died is resized again: delivery is at-least-once);
5. once every album has finished, stops ``w2`` with SIGTERM (a graceful stop) and
   checks, with ``Inspector`` (``streamjobs status``), that nothing is queued, pending
   or owned and nothing was dead-lettered.

Exit code 0 if all of that happened; worker logs are printed on failure.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
from redis.asyncio import Redis

from streamjobs import Inspector
from streamjobs.testing import redis_for_script

HERE = Path(__file__).resolve().parent
ALBUMS, IMAGES, WORK_MS, LOCK_TTL_S = 6, 20, 50, 2
WORKER_ARGS = [
    *("--lock-ttl", str(LOCK_TTL_S)),  # a dead worker's albums resume after ~2 s
    *("--concurrency", "3"),  # albums per worker: the 6 are shared out
    *("--block-ms", "200", "--scan-interval", "2", "--min-idle", "4"),  # a quick demo
]


class Failed(Exception):
    """Why the example failed, in one line."""


@dataclass
class Worker:
    name: str
    process: anyio.abc.Process
    log: Path
    killed: bool = False

    def tail(self) -> str:
        lines = self.log.read_text(errors="replace").splitlines()[-15:]
        return "\n".join(f"    {line}" for line in lines)


async def start_worker(name: str, service: str, url: str, logs: Path) -> Worker:
    paths = [str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "STREAMJOBS_REDIS_URL": url}
    command = [sys.executable, "-m", "streamjobs", "worker", "handlers:Resizer"]
    command += ["--service", service, "--consumer-name", name, *WORKER_ARGS]
    log = logs / f"{name}.log"
    with log.open("wb") as out:  # the worker keeps its own handle
        process = await anyio.open_process(
            command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env
        )
    return Worker(name, process, log)


async def poll(
    what: str, check: Callable[[], Awaitable[bool]], workers: list[Worker], timeout_s: float
) -> None:
    """Poll ``check`` until it is true; a worker that died by itself, or the deadline,
    fails the example."""
    deadline = time.monotonic() + timeout_s
    while not await check():
        for w in workers:
            if not w.killed and w.process.returncode is not None:
                raise Failed(f"worker {w.name} exited with code {w.process.returncode}")
        if time.monotonic() > deadline:
            raise Failed(f"gave up after {timeout_s:g}s waiting for {what}")
        await anyio.sleep(0.05)


def text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def short(streams: list[str]) -> str:
    """``S:album:1, S:album:3`` as ``album:1, album:3``."""
    return ", ".join(s.split(":", 1)[1] for s in streams)


async def run(url: str, service: str, redis: Any, workers: list[Worker], logs: Path) -> str:
    """Steps 1-5 of the module docstring; returns the summary line."""
    inspector = Inspector(redis, service=service)
    key = f"resizer:{{{service}}}:"  # handlers.result_key(service, ...)
    began = time.monotonic()

    def say(line: str) -> None:
        print(f"[{time.monotonic() - began:4.1f}s] {line}", flush=True)

    async def hash_of(what: str) -> dict[str, str]:
        return {text(k): text(v) for k, v in (await redis.hgetall(key + what)).items()}

    async def owned_by(name: str) -> list[str]:
        return sorted(s.stream for s in (await inspector.overview()).streams if s.owner == name)

    # 1. Two workers.
    for name in ("w1", "w2"):
        workers.append(await start_worker(name, service, url, logs))
    w1, w2 = workers

    async def both_started() -> bool:
        return all(
            f"consumer {w.name} of service {service} started" in w.log.read_text(errors="replace")
            for w in workers
        )

    await poll("both workers to start", both_started, workers, 20)
    say("w1 and w2 are running")

    # 2. The producer.
    command = [sys.executable, str(HERE / "producer.py"), "--service", service, url]
    command += ["--albums", str(ALBUMS), "--images", str(IMAGES), "--work-ms", str(WORK_MS)]
    produced = await anyio.run_process(command, check=False)
    if produced.returncode != 0:
        raise Failed(f"producer.py failed: {text(produced.stderr).strip()}")
    say(f"producer.py: {text(produced.stdout).strip()}")

    # 3. kill -9 w1 while it is busy.
    async def w1_busy() -> bool:
        done = int((await hash_of("by_consumer")).get("w1", 0))
        return done >= 5 and bool(await owned_by("w1"))

    await poll("w1 to own albums and resize a few images", w1_busy, workers, 20)
    w1.process.kill()
    await w1.process.wait()
    w1.killed = True
    killed_at = time.monotonic()
    victim = await owned_by("w1")  # a dead worker's locks stay until they expire
    if not victim:
        raise Failed("w1 owned no album when it was killed: there is nothing to recover")
    say(f"SIGKILL w1: it owned {short(victim)}; their locks expire within {LOCK_TTL_S}s")

    # 4. w2 takes over.
    async def w2_resumed() -> bool:
        owned = set(await owned_by("w2"))
        finished = await hash_of("finished")
        return any(s in owned or finished.get(s) == "w2" for s in victim)

    await poll("w2 to resume one of w1's albums", w2_resumed, workers, 20)
    say(f"w2 resumed w1's albums {time.monotonic() - killed_at:.1f}s after the kill")

    async def all_finished() -> bool:
        return int(await redis.hlen(key + "finished")) == ALBUMS

    await poll("every album to finish", all_finished, workers, 30)
    handled = {k: int(v) for k, v in (await hash_of("handled")).items()}
    by_consumer = await hash_of("by_consumer")
    finished = await hash_of("finished")
    twice = sum(handled.values()) - len(handled)
    say(
        f"all {ALBUMS} albums finished: w1 resized {by_consumer.get('w1', 0)} images, "
        f"w2 {by_consumer.get('w2', 0)} ({twice} of them twice, after the kill)"
    )

    # 5. A graceful stop, and nothing left behind.
    w2.process.terminate()  # SIGTERM
    with anyio.fail_after(15):
        code = await w2.process.wait()
    view = await inspector.overview()
    say(f"SIGTERM w2: exit code {code}")
    say(
        f"status: {view.queued} queued, {len(view.pending)} pending, "
        f"{len(view.streams)} owned, {view.dlq.length} dead letters"
    )
    if len(handled) != ALBUMS * IMAGES:
        raise Failed(f"{len(handled)} of {ALBUMS * IMAGES} images were handled")
    if any(finished.get(s) != "w2" for s in victim):
        raise Failed(f"w1's albums were not all finished by w2: {finished}")
    if code != 0 or view.queued or view.pending or view.streams or view.dlq.length:
        raise Failed("w2 did not stop cleanly, or work was left behind")
    return (
        f"done: {ALBUMS} albums, {len(handled)} images handled ({twice} twice), "
        f"w1 killed with {len(victim)} albums, all resumed by w2, nothing pending"
    )


async def main(url: str) -> int:
    service = f"fleet-{uuid.uuid4().hex[:8]}"
    print(f"service {service}")
    redis = Redis.from_url(url)
    logs = Path(tempfile.mkdtemp(prefix="streamjobs-fleet-"))
    workers: list[Worker] = []
    try:
        print(await run(url, service, redis, workers, logs))
        return 0
    except Failed as exc:
        print(f"FAILED: {exc}")
        for w in workers:
            print(f"  --- {w.name} log ---\n{w.tail()}")
        return 1
    finally:
        with anyio.CancelScope(shield=True):
            for w in workers:  # whatever happened, no worker outlives the example
                if w.process.returncode is None:
                    w.process.kill()
                await w.process.wait()
            if keys := [k async for k in redis.scan_iter(match=f"*{service}*")]:
                await redis.delete(*keys)
            await redis.aclose()
            shutil.rmtree(logs, ignore_errors=True)


if __name__ == "__main__":
    with redis_for_script(__doc__.splitlines()[0]) as url:
        code = anyio.run(main, url)
    sys.exit(code)
