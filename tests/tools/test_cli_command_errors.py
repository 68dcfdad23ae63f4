"""``streamjobs`` run as a command (a subprocess), given bad input: a one-line error on
stderr naming what was wrong and where it came from, with no traceback and no password;
``--help``, ``--version`` and the usage of the command that was given a wrong option."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import streamjobs
from streamjobs._urls import ENV_VAR
from streamjobs.cli import CliError, load_consumer_class

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
        ("streamjobs:Producer", "is not a StreamConsumer or GroupConsumer subclass"),
        ("streamjobs:StreamConsumer", "does not implement handle()"),
        ("nocolon", "expected MODULE:NAME"),
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


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--redis-url", "http://127.0.0.1:6379"], "has scheme 'http'"),
        (["--redis-url", "127.0.0.1:6379"], "is not a URL"),
        (["--redis-url", "redis://127.0.0.1:notaport/0"], "has an invalid port"),
        (["--redis-url", "redis://h:notaport"], "'redis://h:notaport' has an invalid port"),
        (["--redis-url", "redis://[::1/0"], "cannot be parsed"),
        (["--redis-url", "redis://u:Se/cret@127.0.0.1:6379/0"], "percent-encode"),
        (["--redis-url", "redis://h/0?db=x"], "selects database 'x'"),
        (["--redis-url", "default:Secret@127.0.0.1:6379"], "'default:***@127.0.0.1:6379'"),
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
    assert r.stderr.startswith("streamjobs: error: "), r.stderr
    assert "ecret" not in r.stderr, "a password was printed"


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


def test_help_gives_the_url_precedence() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "streamjobs", "worker", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={**os.environ, "COLUMNS": "1000"},  # no wrapping
    )
    assert (
        f"in this order: --redis-url; else the contents of --redis-url-file (stripped); "
        f"else ${ENV_VAR}; else the contents of ${ENV_VAR}_FILE; else "
        "redis://127.0.0.1:6379/0" in r.stdout
    )
    assert "SIGHUP" in r.stdout


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (("--service", "s", "--lock-ttl", "-1"), {},
         "streamjobs: invalid configuration: --lock-ttl: must be > 0, got -1.0 (lock_ttl_s)"),
        (("--service", "s"), {"STREAMJOBS_LOCK_TTL": "-2"},
         "streamjobs: invalid configuration: STREAMJOBS_LOCK_TTL=-2: must be > 0, got -2.0 "
         "(lock_ttl_s)"),
        (("--service", "s", "--liveness", "sometimes"), {},
         "streamjobs worker: error: argument --liveness: 'sometimes' is not one of: lock, "
         "session"),
        (("--service", "s", "--log-level", "loud"), {},
         "streamjobs: error: --log-level: 'loud' is not one of DEBUG, INFO, WARNING, ERROR, "
         "CRITICAL"),
    ],
)  # fmt: skip
def test_a_bad_value_names_the_flag_or_variable_it_came_from(
    args: tuple[str, ...], env: dict[str, str], message: str
) -> None:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("STREAMJOBS_")}
    r = subprocess.run(
        [sys.executable, "-m", "streamjobs", "worker", "tests.faults.workers:RecordingWorker",
         *args],
        cwd=ROOT, capture_output=True, text=True, timeout=60, env={**clean, **env},
    )  # fmt: skip
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1] == message


def test_version_and_the_usage_of_the_command_that_was_given_a_wrong_option() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "streamjobs.cli", "--version"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert (r.returncode, r.stdout.strip()) == (0, f"streamjobs {streamjobs.__version__}")
    r = subprocess.run(
        [sys.executable, "-m", "streamjobs", "worker", "m:C", "--service", "s", "--bogus"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 2
    assert r.stderr.startswith("usage: streamjobs worker ")
    assert r.stderr.strip().endswith("streamjobs worker: error: unrecognized arguments: --bogus")


def test_an_unknown_option_of_a_nested_command_prints_that_command_s_usage() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "streamjobs", "dlq", "list", "--service", "s", "--bogus"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 2
    assert r.stderr.startswith("usage: streamjobs dlq list "), r.stderr
    assert r.stderr.strip().endswith("streamjobs dlq list: error: unrecognized arguments: --bogus")
