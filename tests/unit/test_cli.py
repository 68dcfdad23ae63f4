"""The worker command's one-line errors (no traceback) for bad input."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from streamjobs import ConfigurationError, ConsumerConfig, RecoveryConfig
from streamjobs._urls import ENV_VAR, redact, scrub
from streamjobs.cli import CliError, _worker_args, build_configs, load_consumer_class, redis_url
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


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--redis-url", "http://127.0.0.1:6379"], "has scheme 'http'"),
        (["--redis-url", "127.0.0.1:6379"], "is not a URL"),
        (["--redis-url", "redis://127.0.0.1:notaport/0"], "has an invalid port"),
        (["--redis-url", "redis://127.0.0.1:6379/notadb"], "selects database 'notadb'"),
        (["--log-level", "verbose"], "--log-level: 'verbose' is not one of"),
        (["--redis-url", "redis://a", "--redis-url-file", "f"], "not both"),
        (["--redis-url-file", "/no/such/file"], "--redis-url-file: cannot read"),
    ],
)
def test_bad_connection_options_give_one_line_errors(args: list[str], message: str) -> None:
    r = worker("tests.faults.workers:RecordingWorker", "--service", "s", *args)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr
    assert "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_a_password_never_appears_in_an_error() -> None:
    r = worker(
        "tests.faults.workers:RecordingWorker",
        "--service",
        "s",
        "--redis-url",
        "redis://default:S3cretPW@127.0.0.1:1/0",
    )
    assert r.returncode == 2
    assert "cannot reach Redis at redis://default:***@127.0.0.1:1/0" in r.stderr
    assert "S3cretPW" not in r.stderr


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://default:S3cretPW@h:6379/0", "redis://default:***@h:6379/0"),
        ("redis://:S3cretPW@h/1", "redis://:***@h/1"),
        ("rediss://h:6380/0?password=S3cretPW&db=1", "rediss://h:6380/0?password=***&db=1"),
        ("redis://h:6379/0", "redis://h:6379/0"),
        ("unix:///tmp/redis.sock?db=2", "unix:///tmp/redis.sock?db=2"),
    ],
)
def test_urls_are_shown_without_their_password(url: str, shown: str) -> None:
    assert redact(url) == shown
    if "S3cretPW" in url:
        assert scrub(f"auth failed for S3cretPW at {url}", url).count("S3cretPW") == 0


def test_the_url_comes_from_the_flag_then_the_file_then_the_environment(
    tmp_path: Path,
) -> None:
    url_file = tmp_path / "url"
    url_file.write_text("redis://:pw@from-file:6379/2\n")
    env = {ENV_VAR: "redis://from-env:6379/3"}
    assert redis_url(_parse(), env) == "redis://from-env:6379/3"
    assert redis_url(_parse(), {}) == "redis://127.0.0.1:6379/0"
    assert redis_url(_parse("--redis-url-file", str(url_file)), env) == (
        "redis://:pw@from-file:6379/2"
    )
    assert redis_url(_parse("--redis-url", "redis://flag/1"), env) == "redis://flag/1"
    url_file.write_text("  \n")
    with pytest.raises(CliError, match="is empty"):
        redis_url(_parse("--redis-url-file", str(url_file)), env)
    with pytest.raises(CliError, match=f"{ENV_VAR}: 'redis://h/x' selects database 'x'"):
        redis_url(_parse(), {ENV_VAR: "redis://h/x"})
