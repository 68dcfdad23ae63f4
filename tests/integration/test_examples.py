"""Every file in examples/ runs and does what it says (docs that cannot drift).

``examples/demo.py`` has tests of its own, in test_demo.py; ``examples/cluster`` runs
in tests/cluster/test_cluster_examples.py.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from subprocess import CompletedProcess

import pytest
from redis import Redis as SyncRedis

ROOT = Path(__file__).resolve().parents[2]


def test_transcriber_example_runs(redis_url: str) -> None:
    r = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "transcriber.py"), redis_url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[-1] == "all 3 streams finished"
    assert sum(1 for line in lines if line.startswith("end   ")) == 3
    # Order within each stream is strict.
    for i in range(3):
        chunks = [
            line.split()[-1]
            for line in lines
            if line.strip().startswith("call:") and line.strip().split()[0].endswith(f":{i}")
        ]
        assert chunks == ["chunk-0", "chunk-1", "chunk-2"]


# -- the example folders (examples/*/): each run as a user would, as a subprocess ------


def run_example(relative: str, *args: str, timeout_s: float = 60) -> CompletedProcess[str]:
    """Run ``examples/<relative>`` from the repository root, in a process group of its
    own: on a timeout the whole group (worker processes included) is killed, so nothing
    outlives the test. Fails the test if the group still has a live process once the
    example exited (a stray worker)."""
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "examples" / relative), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{relative} still running after {timeout_s}s\n{out}\n{err}")
    try:
        os.killpg(proc.pid, 0)
    except ProcessLookupError:
        pass  # the whole group is gone: nothing left running
    else:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"{relative} left processes running\n{out}\n{err}")
    return CompletedProcess(proc.args, proc.returncode, out, err)


def service_of(r: CompletedProcess[str]) -> str:
    """The service name an example prints on its first line (``service NAME ...``)."""
    first = r.stdout.splitlines()[0] if r.stdout else ""
    assert first.startswith("service "), f"no service line:\n{r.stdout}\n{r.stderr}"
    return first.split()[1]


def keys_left(redis_url: str, service: str) -> list[bytes]:
    """Keys whose name contains ``service``: the examples must delete all of theirs."""
    with SyncRedis.from_url(redis_url) as client:
        return list(client.scan_iter(match=f"*{service}*", count=1000))


def last_line(r: CompletedProcess[str]) -> str:
    lines = r.stdout.splitlines()
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert lines, r.stderr
    return lines[-1]


def test_minimal_example_runs(redis_url: str) -> None:
    r = run_example("minimal/consumer.py", redis_url)
    assert last_line(r) == "done: 2 streams finished, 4 entries handled"
    service = service_of(r)
    for n in (1, 2):
        stream = f"{service}:greetings:{n}"
        texts = [line.split()[-1] for line in r.stdout.splitlines() if f"{stream} " in line]
        assert texts == ["hello", "world", "finished"], r.stdout  # in order, then the end
    assert keys_left(redis_url, service) == []


FLEET_SUMMARY = re.compile(
    r"^done: 6 albums, 120 images handled \((?P<twice>\d+) twice\), "
    r"w1 killed with (?P<victim>\d+) albums, all resumed by w2, nothing pending$"
)


@pytest.mark.faults
def test_fleet_example_survives_a_kill_and_stops_its_workers(redis_url: str) -> None:
    r = run_example("fleet/run.py", redis_url, timeout_s=90)
    match = FLEET_SUMMARY.match(last_line(r))
    assert match is not None, r.stdout
    assert int(match["victim"]) >= 1  # w1 died owning albums, and w2 finished them
    out = r.stdout
    assert "producer.py: queued 6 albums of 20 images" in out
    assert "SIGKILL w1: it owned album:" in out
    assert "w2 resumed w1's albums" in out
    assert "SIGTERM w2: exit code 0" in out
    assert "status: 0 queued, 0 pending, 0 owned, 0 dead letters" in out
    # run_example checked that no worker outlived the script; nothing is left in Redis.
    assert keys_left(redis_url, service_of(r)) == []


PROMETHEUS_SUMMARY = re.compile(
    r"^done: scraped (?P<samples>\d+) streamjobs_\* samples: 8 entries ok, 2 retried$"
)


def test_prometheus_example_scrapes_its_metrics(redis_url: str) -> None:
    r = run_example("prometheus/worker.py", redis_url)
    match = PROMETHEUS_SUMMARY.match(last_line(r))
    assert match is not None, r.stdout
    service = service_of(r)
    scraped = [line.strip() for line in r.stdout.splitlines() if line.startswith("  streamjobs_")]
    assert len(scraped) == int(match["samples"]) > 0
    assert all(f'service="{service}"' in line for line in scraped)
    assert f'streamjobs_stream_events_total{{event="finished",service="{service}"}} 2.0' in scraped
    assert f'streamjobs_handler_failures_total{{service="{service}"}} 2.0' in scraped
    assert re.search(r"^GET http://127\.0\.0\.1:\d+/metrics$", r.stdout, re.MULTILINE)
    assert keys_left(redis_url, service) == []
    config = (ROOT / "examples" / "prometheus" / "prometheus.yml").read_text()
    assert "scrape_configs:" in config
    assert ":9464" in config  # the port the README gives --metrics-port


def test_retry_deadletter_example_dead_letters_two(redis_url: str) -> None:
    r = run_example("retry_deadletter/consumer.py", redis_url)
    assert last_line(r) == "done: handled 2 (p2 after 2 retries), dead-lettered 2"
    lines = [line.strip() for line in r.stdout.splitlines()]
    payments = ("p1", "p2", "p3", "p4")
    attempts = [sum(1 for line in lines if line.startswith(f"{p} (")) for p in payments]
    assert attempts == [1, 3, 1, 4]  # p2: Retry twice, then done; p4: max_handler_attempts
    assert "handled: p1, p2" in lines
    dead = [line for line in lines if "reason=" in line]
    assert [d.split()[1:] for d in dead] == [
        ["p3", "reason=rejected", "attempts=1"],
        ["p4", "reason=handler_failed", "attempts=4"],
    ]
    assert "error: DeadLetter: amount must be positive, got -5" in lines
    assert "error: RuntimeError: payment gateway returned 500" in lines
    assert keys_left(redis_url, service_of(r)) == []


def test_shared_group_example_sends_each_email_once(redis_url: str) -> None:
    r = run_example("shared_group/mailer.py", redis_url)
    assert last_line(r) == "done: 41 sent once each by 3 consumers, 1 replayed, 0 pending"
    lines = [line.strip() for line in r.stdout.splitlines()]
    states = {line.split()[1] for line in lines if line.startswith("m") and "pending" in line}
    assert states == {"alive", "stopped"}
    assert any(line.startswith("dead letter: ") for line in lines)
    assert keys_left(redis_url, service_of(r)) == []


def test_dlq_example_replays_after_the_fix(redis_url: str) -> None:
    r = run_example("dlq/inspect_and_replay.py", redis_url)
    assert last_line(r) == "done: 2 dead-lettered, 2 replayed and handled, 0 left"
    service = service_of(r)
    handled = [line.split()[1] for line in r.stdout.splitlines() if line.startswith("  handled ")]
    assert handled == ["inv-1", "inv-3", "inv-5", "inv-2", "inv-4"]  # replays at the tail
    # The CLI equivalents it prints name the service and the options the CLI has.
    for command in (
        f"$ streamjobs dlq list --service {service} --reason rejected",
        f"$ streamjobs dlq list --service {service} --reason 'unsupported currency CHF'",
        f"$ streamjobs dlq replay --service {service} --reason rejected --dry-run",
        f"$ streamjobs dlq list --service {service} --source-stream {service}:invoices --limit 1",
    ):
        assert command in r.stdout
    assert "would replay 2; nothing changed yet" in r.stdout
    assert "2 rejected for that reason" in r.stdout
    assert keys_left(redis_url, service) == []


CANCEL_SUMMARY = re.compile(
    r"^done: queued stream REMOVED, running stream SIGNALLED and cancelled after "
    r"(?P<handled>\d+) of 50 entries, then NOT_FOUND$"
)


def test_cancel_example_removes_and_signals(redis_url: str) -> None:
    r = run_example("cancel/cancel_stream.py", redis_url)
    match = CANCEL_SUMMARY.match(last_line(r))
    assert match is not None, r.stdout
    assert 3 <= int(match["handled"]) < 50
    service = service_of(r)
    out = r.stdout
    assert f"cancel {service}:export:2: REMOVED" in out
    assert f"cancel {service}:export:1: SIGNALLED" in out
    assert f"on_stream_cancelled('{service}:export:1', 'customer cancelled')" in out
    assert f"started {service}:export:2" not in out  # the removed one never ran
    assert "ended normally" not in out
    assert keys_left(redis_url, service) == []


def test_resources_example_opens_and_closes_its_archive_around_the_work(
    redis_url: str, service: str, uid: str, tmp_path: Path
) -> None:
    import json
    import time

    from streamjobs._keys import Keys
    from streamjobs._wire import EOS_FIELD, EOS_VALUE, build_fields

    archive = tmp_path / "archive.jsonl"
    stream = f"notes:{uid}"
    with SyncRedis.from_url(redis_url) as client:
        client.xadd(stream, {"text": "hello"})
        client.xadd(stream, {EOS_FIELD: EOS_VALUE})
        client.xadd(Keys(service).assignments, build_fields(stream, {}))
        worker = subprocess.Popen(
            [sys.executable, "-m", "streamjobs", "worker", "resources.app:make",
             "--service", service, "--redis-url", redis_url],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT / "examples"), "ARCHIVE_PATH": str(archive)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 30
            while not (archive.exists() and archive.read_text()):
                assert time.monotonic() < deadline, "nothing archived"
                time.sleep(0.05)
        finally:
            worker.send_signal(signal.SIGTERM)
            out, _ = worker.communicate(timeout=30)
        assert worker.returncode == 0, out
        [line] = archive.read_text().splitlines()
        assert json.loads(line) == {"stream": stream, "id": json.loads(line)["id"], "text": "hello"}
        for key in client.scan_iter(match=f"*{service}*"):
            client.delete(key)
        client.delete(stream)


PROGRAMS = sorted(
    str(p.relative_to(ROOT / "examples"))
    for p in (ROOT / "examples").rglob("*.py")
    if p.name not in ("__init__.py", "handlers.py", "app.py") and not p.name.startswith("test_")
)
"""Every example that runs as a program (handlers.py and app.py are worker targets,
test_*.py a pytest module)."""


@pytest.mark.parametrize("program", PROGRAMS)
def test_every_example_answers_help(program: str) -> None:
    r = subprocess.run(
        [sys.executable, str(ROOT / "examples" / program), "--help"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("usage: "), r.stdout
    assert "--help" in r.stdout


def test_an_example_given_no_url_runs_on_a_private_server(require_redis_server: str) -> None:
    """Not on whatever answers at 6379: nothing of the run may land there."""
    env = {k: v for k, v in os.environ.items() if k != "STREAMJOBS_REDIS_URL"}
    r = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "minimal" / "consumer.py")],
        cwd=ROOT, capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert last_line(r) == "done: 2 streams finished, 4 entries handled"
    assert "(a private Redis server for this run: redis://127.0.0.1:" in r.stderr
