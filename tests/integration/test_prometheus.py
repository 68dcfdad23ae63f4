"""PrometheusRecorder against real Redis: the metrics move as a dead letter, a
recovery of a dead owner's assignment and a graceful hand-back happen, read from a
real registry."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from streamjobs import (
    ConsumerConfig,
    DeadLetter,
    Message,
    Producer,
    PrometheusRecorder,
    RecoveryConfig,
)
from streamjobs._keys import Keys
from tests.harness.plugin import ConsumerFactory

from ._helpers import Recorder, eventually

pytestmark = pytest.mark.anyio


class Refusing(Recorder):
    async def handle(self, message: Message) -> None:
        await super().handle(message)
        if message.fields.get("n") == "bad":
            raise DeadLetter("bad entry")


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


async def test_metrics_follow_a_dead_letter_a_recovery_and_a_hand_back(
    redis: Any, service: str, uid: str, consumer_factory: ConsumerFactory
) -> None:
    keys = Keys(service)
    registry = CollectorRegistry()
    producer = Producer(redis, service=service)
    done, crashed, idle = f"done:{uid}", f"crashed:{uid}", f"idle:{uid}"
    for stream in (done, crashed):
        await producer.add_stream(stream)
        await producer.append(stream, {"n": "0"})
        await producer.append(stream, {"n": "bad"})
        await producer.close_stream(stream)
    # A consumer that died right after taking one assignment: recovery re-queues it.
    await redis.xgroup_create(keys.assignments, service, id="0", mkstream=True)
    await redis.xreadgroup(service, "dead", {keys.assignments: ">"}, count=1)
    consumer = consumer_factory(
        Refusing,
        config=ConsumerConfig(lock_ttl_s=1, read_block_ms=50, sample_interval_s=0.2),
        recovery=RecoveryConfig(min_idle_s=1.5, interval_s=0.5, lease_check_interval_s=0.2),
        metrics=PrometheusRecorder(registry),
    )
    s = {"service": service}
    async with consumer:

        async def both_finished() -> bool:
            return sorted(consumer.ended) == sorted([done, crashed])

        await eventually(both_finished, timeout_s=30)
        await producer.add_stream(idle)  # owned, idle, when the consumer stops

        async def owns_idle() -> bool:
            return idle in consumer.owned_streams

        await eventually(owns_idle)
        assert value(registry, "streamjobs_owned_streams", **s) == 1

        async def heartbeat_counted() -> bool:  # every lock_ttl / 3 while it owns one
            return value(registry, "streamjobs_heartbeats_total", result="ok", **s) >= 1

        await eventually(heartbeat_counted)

        async def sampled() -> bool:
            # A sample taken after both streams finished: the idle stream's assignment
            # is the one pending, and both dead letters are in (samples every 0.2 s).
            return (
                value(registry, "streamjobs_pending_assignments", **s) == 1
                and value(registry, "streamjobs_dlq_length", **s) == 2
            )

        await eventually(sampled)
        assert value(registry, "streamjobs_group_consumers", **s) >= 1
        assert value(registry, "streamjobs_oldest_pending_age_seconds", **s) >= 0
        stats = consumer.statistics()
        assert stats.ready
        assert stats.healthy
        assert stats.owned_streams == 1
        assert stats.entries == {"ok": 2, "dead_lettered": 2}
    # Done with: two handled, two dead-lettered after failing.
    handling = "streamjobs_entry_handling_seconds_count"
    assert value(registry, handling, outcome="ok", **s) == 2
    assert value(registry, handling, outcome="dead_lettered", **s) == 2
    assert value(registry, handling, outcome="retried", **s) == 0
    assert value(registry, "streamjobs_handler_failures_total", **s) == 2
    assert value(registry, "streamjobs_dead_letters_total", reason="rejected", **s) == 2
    assert value(registry, "streamjobs_recoveries_total", outcome="requeued", **s) >= 1
    # The dead consumer's stream was resumed here: one recovery latency observed.
    assert value(registry, "streamjobs_recovery_latency_seconds_count", **s) >= 1
    assert value(registry, "streamjobs_keyspace_setups_total", result="ok", **s) >= 1
    assert value(registry, "streamjobs_scan_pass_seconds_count", **s) >= 1
    assert value(registry, "streamjobs_stream_events_total", event="finished", **s) == 2
    assert value(registry, "streamjobs_stream_events_total", event="handed_back", **s) == 1
    assert value(registry, "streamjobs_owned_streams", **s) == 0
    exposition = generate_latest(registry).decode()
    assert f'streamjobs_dead_letters_total{{reason="rejected",service="{service}"}} 2.0' in (
        exposition
    )
    assert uid not in exposition.replace(service, ""), "a stream name leaked into a label"
