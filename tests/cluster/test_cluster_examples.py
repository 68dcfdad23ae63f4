"""``examples/cluster/consumer.py`` on the session's real cluster, run as a user would."""

from __future__ import annotations

import re

from redis.cluster import RedisCluster as SyncRedisCluster

from tests.harness.cluster import ClusterEndpoint
from tests.integration.test_examples import last_line, run_example, service_of

SUMMARY = re.compile(
    r"^done: 6 streams on (?P<primaries>\d+) primaries finished, 18 entries handled$"
)
PLACEMENT = re.compile(r"^  (?P<stream>\S+): slot (?P<slot>\d+) on (?P<node>\S+:\d+)$")


def test_cluster_example_runs(redis_cluster: ClusterEndpoint) -> None:
    r = run_example("cluster/consumer.py", redis_cluster.url)
    match = SUMMARY.match(last_line(r))
    assert match is not None, r.stdout
    service = service_of(r)
    lines = r.stdout.splitlines()
    assert re.match(rf"^service {re.escape(service)} on a cluster of \d+ primaries$", lines[0])
    placed = [m for m in map(PLACEMENT.match, lines) if m is not None]
    assert [m["stream"] for m in placed] == [f"{service}:orders:{n}" for n in range(6)]
    nodes = {m["node"] for m in placed}
    assert "?" not in nodes
    assert int(match["primaries"]) == len(nodes)
    assert "reset_topology(): subscriptions rebuilt on the current primaries" in lines
    finished = sorted(line.split()[0] for line in lines if line.endswith(" finished"))
    assert finished == [f"{service}:orders:{n}" for n in range(6)]
    with SyncRedisCluster.from_url(redis_cluster.url) as client:
        # SCAN on every primary: the example deleted every key it made.
        assert list(client.scan_iter(match=f"*{service}*", count=1000)) == []
