"""The worker command's settings, read in-process: options and environment variables
made into configurations, the URL's precedence and redaction, which failures are blamed
on TLS (the command run as a process: tests/tools/test_cli_command_errors.py)."""

from __future__ import annotations

import argparse
import signal
import ssl
from pathlib import Path

import pytest
import redis.exceptions

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
    redis_url,
    stop_signals,
)
from streamjobs.config import default_min_idle_s


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
