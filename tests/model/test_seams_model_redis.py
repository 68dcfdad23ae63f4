"""The model of where features meet (tests/harness/seams_model.py) against real Redis
and the real scripts: a smaller run than over the in-memory gateway
(tests/model/test_seams_model.py), since every step waits on a real server. Both
liveness modes.

Its first runs found two defects, both fixed (a job cancelled before it was read left
its entries to the next job of the name; a cancel racing its job's own end left the
cancel marker behind). A bounded run is part of every test run; a longer one:

    STREAMJOBS_MODEL_EXAMPLES=15 STREAMJOBS_MODEL_STEPS=20 .venv/bin/python -m pytest \
        tests/model/test_seams_model_redis.py -q -p no:logging
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from redis.asyncio import Redis as AsyncRedis

from streamjobs import Liveness
from tests.harness.seams_model import RedisWorld, SeamsModel, World, run

EXAMPLES = int(os.environ.get("STREAMJOBS_MODEL_EXAMPLES", "3"))
STEPS = int(os.environ.get("STREAMJOBS_MODEL_STEPS", "10"))


@pytest.mark.timeout(0 if "STREAMJOBS_MODEL_EXAMPLES" in os.environ else 600)
@pytest.mark.parametrize("liveness", [Liveness.LOCK, Liveness.SESSION], ids=["lock", "session"])
def test_the_seams_model_on_redis(
    liveness: Liveness, redis_url: str, service: str, uid: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    examples = iter(range(10**6))

    async def make_world() -> World:
        # A new service per example: nothing one example left can meet the next.
        n = next(examples)
        return RedisWorld(AsyncRedis.from_url(redis_url), f"{service}-{n}", f"{uid}-{n}")

    async def close_world(world: Any) -> None:
        client = world.client
        keys = [k async for k in client.scan_iter(match=f"*{world.uid}*")]
        keys += [k async for k in client.scan_iter(match=f"*{world.service}*")]
        if keys:
            await client.delete(*keys)
        await client.aclose()

    class Model(SeamsModel):
        pass

    Model.liveness = liveness
    Model.make_world = staticmethod(make_world)
    Model.close_world = staticmethod(close_world)
    # The bounded run in the suite is the same examples every time; a longer one explores.
    run(
        Model,
        EXAMPLES,
        STEPS,
        monkeypatch,
        derandomize="STREAMJOBS_MODEL_EXAMPLES" not in os.environ,
    )
