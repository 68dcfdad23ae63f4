"""The client and server settings a consumer depends on: a client that decodes
responses and an evicting server are refused (unless eviction is allowed), and the
keyspace flags a restart without persistence lost are set again."""

from __future__ import annotations

import dataclasses

import pytest
from redis.asyncio import Redis as AsyncRedis
from redis.exceptions import ConnectionError as RedisConnectionError

from streamjobs import ConfigurationError, ConsumerConfig, RecoveryConfig
from tests.harness.plugin import RedisServerFactory

from ._helpers import Recorder, eventually

pytestmark = pytest.mark.anyio

FAST = ConsumerConfig(lock_ttl_s=2, read_block_ms=50, handler_backoff_s=0.01)
RECOVERY = RecoveryConfig(min_idle_s=3, interval_s=1)


async def test_a_client_that_decodes_responses_is_refused(redis_url: str, service: str) -> None:
    client = AsyncRedis.from_url(redis_url, decode_responses=True)
    try:
        with pytest.raises(ConfigurationError, match="decode_responses") as caught:
            Recorder(client, service=service)
        assert caught.value.field == "redis"
    finally:
        await client.aclose()


async def test_keyspace_flags_come_back_after_a_restart_without_persistence(
    redis_server_factory: RedisServerFactory, service: str
) -> None:
    server = redis_server_factory()
    client = AsyncRedis.from_url(server.url)
    try:
        c = Recorder(client, service=service, config=FAST, recovery=RECOVERY)
        async with c:

            async def flags() -> str:
                try:
                    reply = await client.config_get("notify-keyspace-events")
                except RedisConnectionError:  # the test's own connection, cut by the restart
                    return ""
                return str(reply["notify-keyspace-events"])

            async def set_() -> bool:
                return set(await flags()) >= set("Kx")

            await eventually(set_)
            server.restart()  # no AOF, no RDB: the flags are gone
            await eventually(set_, timeout_s=20)
    finally:
        await client.aclose()


@pytest.mark.parametrize("policy", ["allkeys-lru", "volatile-ttl"])
async def test_an_evicting_server_is_refused_unless_allowed(
    redis_server_factory: RedisServerFactory,
    service: str,
    caplog: pytest.LogCaptureFixture,
    policy: str,
) -> None:
    """Under volatile-ttl locks go first; under allkeys-lru the assignment stream
    itself: by default a consumer does not start, and says why."""
    server = redis_server_factory(extra_args=["--maxmemory-policy", policy])
    client = AsyncRedis.from_url(server.url)
    try:
        strict = Recorder(client, service=service, config=FAST, recovery=RECOVERY)
        with pytest.raises(ConfigurationError, match=policy) as caught:
            await strict.run()
        assert caught.value.field == "maxmemory-policy"
        lenient = Recorder(
            client,
            service=service,
            config=dataclasses.replace(FAST, require_noeviction=False),
            recovery=RECOVERY,
        )
        async with lenient:
            pass
        assert f"maxmemory-policy is '{policy}'" in caplog.text
    finally:
        await client.aclose()
