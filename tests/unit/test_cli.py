"""The worker command's one-line errors (no traceback) for bad input."""

from __future__ import annotations

import argparse
import os
import signal
import ssl
import subprocess
import sys
from pathlib import Path

import pytest
import redis.exceptions

import streamjobs
from streamjobs import (
    ConfigurationError,
    ConsumerConfig,
    Liveness,
    RecoveryConfig,
    RedisUnavailable,
)
from streamjobs._redis import is_tls_failure
from streamjobs._urls import ENV_VAR, redact, scrub
from streamjobs.cli import (
    CliError,
    _worker_args,
    build_configs,
    load_consumer_class,
    redis_url,
    stop_signals,
)
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


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://default:S3cretPW@h:6379/0", "redis://default:***@h:6379/0"),
        ("redis://:S3cretPW@h/1", "redis://:***@h/1"),
        ("rediss://h:6380/0?password=S3cretPW&db=1", "rediss://h:6380/0?password=***&db=1"),
        ("redis://h:6379/0", "redis://h:6379/0"),
        ("unix:///tmp/redis.sock?db=2", "unix:///tmp/redis.sock?db=2"),
        ("unix://:S3cretPW@/tmp/redis.sock", "unix://:***@/tmp/redis.sock"),
        ("redis://u:S3cretPW@h:notaport/0", "redis://u:***@h:notaport/0"),
        ("redis://u:S3cretPW@h/0?PASSWORD=S3cretPW", "redis://u:***@h/0?PASSWORD=***"),
        # Not URLs, or passwords with an unescaped / ? # (redis-py misreads them too):
        # everything up to the last '@' may be secret.
        ("default:S3cretPW@h:6379", "default:***@h:6379"),
        ("redis://u:S3c/retPW@h:6379/0", "redis://u:***@h:6379/0"),
        ("redis://u:S3c?retPW@h/0", "redis://u:***@h/0"),
        ("redis://u:S3c#retPW@h/0", "redis://u:***@h/0"),
        ("redis://h/0?client_name=a@b&password=S3cretPW", "redis://***@b&password=***"),
        ("redis://S3cretPW@h/0", "redis://***@h/0"),
    ],
)
def test_urls_are_shown_without_their_password(url: str, shown: str) -> None:
    assert redact(url) == shown
    if "S3cretPW" in url:
        assert scrub(f"auth failed for S3cretPW at {url}", url).count("S3cretPW") == 0


def test_a_percent_encoded_password_is_scrubbed_in_both_forms() -> None:
    url = "redis://u:p%40ss%2Fw0rd@h/0"
    assert redact(url) == "redis://u:***@h/0"
    assert scrub("AUTH p@ss/w0rd failed (p%40ss%2Fw0rd)", url) == "AUTH *** failed (***)"


def test_sighup_stops_the_worker_unless_it_was_started_ignoring_it() -> None:
    assert signal.SIGHUP in stop_signals()
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        assert stop_signals() == (signal.SIGTERM, signal.SIGINT)
    finally:
        signal.signal(signal.SIGHUP, previous)


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
    url_file.write_bytes(b"redis://:\xff\xfe@h/0")
    with pytest.raises(CliError, match="is not UTF-8 text"):
        redis_url(_parse("--redis-url-file", str(url_file)), env)
    with pytest.raises(CliError, match=f"{ENV_VAR}: 'redis://h/x' selects database 'x'"):
        redis_url(_parse(), {ENV_VAR: "redis://h/x"})


def _raised_from(cause: BaseException) -> BaseException:
    try:
        raise RedisUnavailable(f"{type(cause).__name__}: {cause}") from cause
    except RedisUnavailable as exc:
        return exc


def test_only_handshake_failures_and_timeouts_are_blamed_on_tls() -> None:
    assert is_tls_failure(_raised_from(redis.exceptions.TimeoutError("Timeout connecting")))
    assert is_tls_failure(_raised_from(ssl.SSLError("WRONG_VERSION_NUMBER")))
    assert is_tls_failure(TimeoutError())
    assert not is_tls_failure(_raised_from(redis.exceptions.AuthenticationError("bad password")))
    assert not is_tls_failure(_raised_from(redis.exceptions.ConnectionError("Error 111")))


class _DroppedOnce:
    """A client whose first PING meets a connection the server just dropped."""

    def __init__(self) -> None:
        self.pings = 0

    async def ping(self) -> bool:
        self.pings += 1
        if self.pings == 1:
            raise ConnectionError("Error while reading from 127.0.0.1:6379 : (104, reset)")
        return True


@pytest.mark.anyio
async def test_the_connection_check_tries_a_dropped_connection_once_more() -> None:
    """A worker started while the server dropped connections (the cluster soak saw one
    exit with status 2) is not refused for it."""
    from streamjobs.cli import check_connection

    client = _DroppedOnce()
    await check_connection(client, "redis://127.0.0.1:6379/0", timeout_s=5)
    assert client.pings == 2


# -- settings from the environment, and one-line errors naming their source --------


def test_every_worker_option_names_its_environment_variable_in_help() -> None:
    from streamjobs.cli import _env_options, _worker_args, env_name

    parser = argparse.ArgumentParser()
    worker = _worker_args(parser.add_subparsers())
    options = _env_options(worker)
    assert len(options) >= 20
    for action in options:
        assert action.help is not None
        assert action.help.endswith(f"[env {env_name(action.option_strings[-1])}]"), action
    assert env_name("--redis-url") == ENV_VAR  # the variable that always existed


def _worker_ns(*args: str, env: dict[str, str]) -> argparse.Namespace:
    from streamjobs.cli import _worker_args, apply_environment

    parser = argparse.ArgumentParser()
    worker = _worker_args(parser.add_subparsers(dest="command"))
    ns = parser.parse_args(["worker", "m:C", *args])
    apply_environment(worker, ns, env)
    return ns


def test_the_environment_fills_what_the_flags_do_not_and_a_flag_wins() -> None:
    ns = _worker_ns(
        "--lock-ttl",
        "3",
        env={
            "STREAMJOBS_SERVICE": "svc",
            "STREAMJOBS_LOCK_TTL": "9",
            "STREAMJOBS_CONCURRENCY": "7",
            "STREAMJOBS_LIVENESS": "LOCK",
            "STREAMJOBS_CLUSTER": "yes",
            "STREAMJOBS_NO_CONFIGURE_KEYSPACE": "0",
            "STREAMJOBS_METRICS_PORT": "9100",
        },
    )
    assert (ns.service, ns.lock_ttl_s, ns.max_concurrent_streams) == ("svc", 3.0, 7)
    assert (ns.liveness, ns.cluster, ns.no_configure_keyspace) == (Liveness.LOCK, True, False)
    assert (ns.metrics_port, ns.metrics_host, ns.log_level) == (9100, "0.0.0.0", "INFO")
    assert ns.sources["lock_ttl_s"] == "--lock-ttl"
    assert ns.sources["max_concurrent_streams"] == "STREAMJOBS_CONCURRENCY=7"
    consumer, _ = build_configs(ns)
    assert (consumer.lock_ttl_s, consumer.max_concurrent_streams) == (3.0, 7)


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        ((), {"STREAMJOBS_SERVICE": "s", "STREAMJOBS_LOCK_TTL": "abc"},
         "STREAMJOBS_LOCK_TTL: invalid float value 'abc'"),
        ((), {"STREAMJOBS_SERVICE": "s", "STREAMJOBS_LIVENESS": "never"},
         "STREAMJOBS_LIVENESS: 'never' is not one of: lock, session"),
        ((), {"STREAMJOBS_SERVICE": "s", "STREAMJOBS_CLUSTER": "maybe"},
         "STREAMJOBS_CLUSTER='maybe': expected one of 1, true, yes, on, 0, false, no, off"),
        ((), {}, "--service is required (or set STREAMJOBS_SERVICE)"),
        (("--allow-eviction",), {"STREAMJOBS_SERVICE": "s", "STREAMJOBS_REQUIRE_NOEVICTION": "1"},
         "--allow-eviction and STREAMJOBS_REQUIRE_NOEVICTION=1 contradict each other"),
    ],
)  # fmt: skip
def test_a_bad_environment_value_is_one_line_naming_the_variable(
    args: tuple[str, ...], env: dict[str, str], message: str
) -> None:
    with pytest.raises(CliError) as raised:
        _worker_ns(*args, env=env)
    assert str(raised.value) == message


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
