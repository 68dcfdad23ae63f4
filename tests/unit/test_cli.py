"""The worker command's one-line errors (no traceback) for bad input."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from streamjobs import ConfigurationError, ConsumerConfig, RecoveryConfig
from streamjobs.cli import CliError, _worker_args, build_configs, load_consumer_class
from streamjobs.config import default_min_idle_s

ROOT = Path(__file__).resolve().parents[2]


def worker(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "streamjobs", "worker", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("no_such_module_xyz:C", "cannot import module 'no_such_module_xyz'"),
        ("streamjobs:Nope", "has no attribute 'Nope'"),
        ("streamjobs:Producer", "is not a StreamConsumer subclass"),
        ("streamjobs:StreamConsumer", "does not implement handle()"),
        ("nocolon", "expected MODULE:CLASS"),
    ],
)
def test_bad_targets_give_one_line_errors(target: str, message: str) -> None:
    with pytest.raises(CliError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_consumer_class(target)
    r = worker(target, "--service", "s")
    assert r.returncode == 2
    assert message in r.stderr
    assert "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_unreachable_redis_is_one_line() -> None:
    r = worker(
        "tests.faults.workers:RecordingWorker",
        "--service",
        "s",
        "--redis-url",
        "redis://127.0.0.1:1/0",
    )
    assert r.returncode == 2
    assert "cannot reach Redis at redis://127.0.0.1:1/0" in r.stderr
    assert "Traceback" not in r.stderr


def test_invalid_configuration_names_the_field() -> None:
    r = worker("tests.faults.workers:RecordingWorker", "--service", "s", "--lock-ttl", "-1")
    assert r.returncode == 2
    assert "lock_ttl_s" in r.stderr
    assert "Traceback" not in r.stderr


def _parse(*args: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    _worker_args(parser.add_subparsers())
    return parser.parse_args(["worker", "m:C", "--service", "s", *args])


def test_unset_options_keep_the_configuration_defaults() -> None:
    consumer, recovery = build_configs(_parse())
    assert consumer == ConsumerConfig()
    assert recovery == RecoveryConfig(min_idle_s=default_min_idle_s(consumer.lock_ttl_s))


def test_options_set_their_fields() -> None:
    consumer, recovery = build_configs(
        _parse("--lock-ttl", "20", "--concurrency", "3", "--max-retries", "5")
    )
    assert (consumer.lock_ttl_s, consumer.max_concurrent_streams) == (20.0, 3)
    assert recovery.max_retries == 5
    assert recovery.min_idle_s == default_min_idle_s(20.0) == 30.0


def test_a_bad_option_names_its_field() -> None:
    with pytest.raises(ConfigurationError, match="lock_ttl_s"):
        build_configs(_parse("--lock-ttl", "0"))
