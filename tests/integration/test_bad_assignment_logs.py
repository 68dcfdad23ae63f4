"""A 1 MB bad assignment value against real Redis: every log line stays a few KB,
quoting a bounded prefix and the size, while the dead letter keeps its reason and
the whole entry."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from streamjobs import ConsumerConfig, DeadLetterReason
from streamjobs._deadletter import parse_dead_letter
from streamjobs._keys import Keys
from tests.harness.plugin import ConsumerFactory

from ._helpers import Recorder, eventually

pytestmark = pytest.mark.anyio

MB = 1024 * 1024
LOG_LINE_MAX = 4096


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


async def test_a_megabyte_bad_value_is_logged_short_and_dead_lettered_with_its_reason(
    redis: Any,
    service: str,
    uid: str,
    consumer_factory: ConsumerFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="streamjobs")
    keys = Keys(service)
    huge = "7" * 10 + "x" * (MB - 10)
    bad = [
        {"stream": f"s:{uid}", "_retry_count": huge},
        {"stream": f"s:{uid}:" + "n" * MB},
    ]
    ids = [_text(await redis.xadd(keys.assignments, fields)) for fields in bad]
    consumer = consumer_factory(Recorder, config=ConsumerConfig(read_block_ms=50))
    async with consumer:

        async def all_dead() -> bool:
            return int(await redis.xlen(keys.dead_letters)) == len(bad)

        await eventually(all_dead)
    records = {
        r.id: r
        for r in (
            parse_dead_letter(_text(i), {_text(k): _text(v) for k, v in f.items()})
            for i, f in await redis.xrange(keys.dead_letters)
        )
    }
    by_source = {r.source_id: r for r in records.values()}
    assert set(by_source) == set(ids)
    retry, name = by_source[ids[0]], by_source[ids[1]]
    for record in (retry, name):
        assert record.reason is DeadLetterReason.UNPARSEABLE
    # The original fields stay whole (``_retry_count`` is dead-letter metadata).
    assert name.fields == bad[1], "the dead letter lost part of the entry"
    assert retry.fields == {"stream": f"s:{uid}"}
    assert "_retry_count must be a non-negative decimal, got '7777777777xxx" in retry.error
    assert f"…({MB} bytes)" in retry.error
    assert "the most is 1024" in name.error

    logged = [r.getMessage() for r in caplog.records if r.name.startswith("streamjobs")]
    unparseable = [m for m in logged if "unparseable" in m]
    assert len(unparseable) >= len(bad), logged
    assert any(f"…({MB} bytes)" in m for m in unparseable), unparseable
    longest = max(logged, key=len)
    assert len(longest) < LOG_LINE_MAX, f"a {len(longest)}-character log line: {longest[:300]}"
