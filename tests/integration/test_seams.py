"""Where features meet (issue: correct at the seams), against real Redis."""

from __future__ import annotations

import logging

import pytest
from redis.asyncio import Redis as AsyncRedis

from streamjobs import Producer
from streamjobs._keys import Keys
from streamjobs._recovery import Recoverer
from streamjobs._redis import Gateway
from streamjobs.metrics import NullRecorder, RequeueOutcome

pytestmark = pytest.mark.anyio


async def test_requeue_log_names_the_consumer_that_is_gone(
    redis: AsyncRedis, service: str, uid: str, caplog: pytest.LogCaptureFixture
) -> None:
    keys = Keys(service)
    gw = Gateway(redis, keys)
    await gw.ensure_group()
    aid = await Producer(redis, service=service).add_stream(f"data:{uid}")
    await redis.xreadgroup(service, f"ghost-{uid}", {keys.assignments: ">"}, count=1)
    recoverer = Recoverer(gw, max_retries=3, metrics=NullRecorder(), service=service)
    with caplog.at_level(logging.INFO, logger="streamjobs._recovery"):
        assert await recoverer.recover(aid) is RequeueOutcome.REQUEUED
    [line] = [r.getMessage() for r in caplog.records if "re-queued" in r.getMessage()]
    assert f"its owner 'ghost-{uid}' is gone" in line
