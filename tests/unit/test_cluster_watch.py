"""The cluster watcher's topology check (``_notifications.cluster_view``) survives a
node client whose close fails: the 30-minute cluster soak saw redis-py raise
``TimeoutError: Timed out closing connection after 5.0`` from that close just after a
primary was killed, which ended the watcher and with it the worker (exit 1)."""

from __future__ import annotations

from typing import Any

import pytest
import redis.exceptions

from streamjobs import _notifications

pytestmark = pytest.mark.anyio

NODES = [("127.0.0.1", 7000), ("127.0.0.1", 7001)]
SLOTS = {(0, 16383): NODES[0]}


class _Node:
    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port


class _Manager:
    startup_nodes: dict[str, _Node] = {}


class _Cluster:
    nodes_manager = _Manager()

    def get_nodes(self) -> list[_Node]:
        return [_Node(h, p) for h, p in NODES]


class _ClosingFails:
    closed = 0

    async def aclose(self) -> None:
        _ClosingFails.closed += 1
        raise redis.exceptions.TimeoutError("Timed out closing connection after 5.0")


async def test_a_node_client_whose_close_fails_does_not_end_the_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def state(client: Any) -> tuple[str, dict[tuple[int, int], tuple[str, int]]]:
        return "ok", SLOTS

    monkeypatch.setattr(_notifications, "node_client", lambda cluster, addr: _ClosingFails())
    monkeypatch.setattr(_notifications, "cluster_state", state)
    view = await _notifications.cluster_view(_Cluster())
    assert view.primaries == frozenset({NODES[0]})
    assert view.settled
    assert _ClosingFails.closed == len(NODES)  # every client was closed, or tried
