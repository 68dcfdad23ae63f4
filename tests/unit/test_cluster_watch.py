"""The cluster watcher's topology check (``_notifications.cluster_view``) survives a
node client whose close fails: the 30-minute cluster soak saw redis-py raise
``TimeoutError: Timed out closing connection after 5.0`` from that close just after a
primary was killed, which ended the watcher and with it the worker (exit 1). So does
the watch loop around it, whatever the check raises, and the worker's own final close."""

from __future__ import annotations

import argparse
from typing import Any

import anyio
import pytest
import redis.exceptions

from streamjobs import _notifications
from streamjobs.metrics import NullRecorder

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


class _Recorder(NullRecorder):
    def __init__(self) -> None:
        self.loop_errors: list[str] = []

    def loop_error(self, service: str, loop: str) -> None:
        self.loop_errors.append(loop)


async def test_an_odd_error_of_the_topology_check_does_not_end_the_watcher(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The watch loop counts any error of a check and checks again, and still returns
    for a rebuild when the primaries move."""
    calls: list[int] = []

    async def view(cluster: Any) -> _notifications.Topology:
        calls.append(1)
        if len(calls) == 1:
            raise ValueError("an odd reply")
        return _notifications.Topology(frozenset({NODES[1]}), settled=True)

    monkeypatch.setattr(_notifications, "cluster_view", view)
    metrics = _Recorder()
    watcher = _notifications.ClusterWatcher(
        _Cluster(),
        "__keyspace@0__:*",
        ensure_flags=_no_flags,
        on_expired=lambda: None,
        metrics=metrics,
        service="svc",
        check_interval_s=0.01,
    )
    with anyio.fail_after(5):
        await watcher._watch(frozenset({NODES[0]}), anyio.Event())
    assert len(calls) == 2
    assert metrics.loop_errors == ["subscriber"]


async def _no_flags(client: Any) -> bool:
    return False


async def test_a_clean_stop_whose_final_close_fails_still_ends_cleanly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``streamjobs worker``: the consumer stopped; closing its client then fails (a
    node gone mid-failover). That must not turn the clean stop into an error."""
    from streamjobs import cli

    async def fine(*args: Any) -> None:
        return None

    async def built(*args: Any) -> object:
        return object()

    monkeypatch.setattr(cli, "load_consumer_target", lambda target: object)
    monkeypatch.setattr(cli, "build_consumer", built)
    monkeypatch.setattr(cli, "build_configs", lambda ns: (None, None))
    monkeypatch.setattr(cli, "redis_url", lambda ns: "redis://127.0.0.1:1/0")
    monkeypatch.setattr(cli, "connect", lambda url, cluster: _ClosingFails())
    monkeypatch.setattr(cli, "check_connection", fine)
    monkeypatch.setattr(cli, "serve", fine)
    closed = _ClosingFails.closed
    ns = argparse.Namespace(
        target="m:C", metrics_port=None, service="svc", cluster=False, consumer_name=None
    )
    await cli.run_worker(ns)  # returns: the close's TimeoutError is not raised
    assert _ClosingFails.closed == closed + 1


async def test_a_dropped_idle_wait_subscription_is_a_one_line_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A primary killed under the cluster waiter drops its pub/sub connection: redis-py's
    ConnectionError reaches the node's loop wrapped in the task group's exception
    group. The cluster soak logged it as an unexpected ERROR with its traceback; it is
    a Redis failure like any other, and its streams are woken to read by themselves."""
    from streamjobs import _cluster_waiter

    calls = 0
    again = anyio.Event()

    async def serve(self: Any) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ExceptionGroup(
                "unhandled errors in a TaskGroup",
                [redis.exceptions.ConnectionError("Connection closed by server.")],
            )
        again.set()  # it carries on: a second subscription
        await anyio.sleep_forever()

    monkeypatch.setattr(_cluster_waiter._Node, "_serve", serve)
    no_gateway: Any = None  # the node's loop never reaches it here
    waiter = _cluster_waiter.ClusterWaiter(
        _Cluster(), no_gateway, metrics=NullRecorder(), service="svc"
    )
    node = _cluster_waiter._Node(waiter, "n1", NODES[0])
    node.streams.add("s")
    woken = anyio.Event()
    monkeypatch.setattr(waiter, "wake", lambda stream: woken.set())
    with caplog.at_level("DEBUG", logger="streamjobs._cluster_waiter"):
        async with anyio.create_task_group() as tg:
            tg.start_soon(node.run)
            with anyio.fail_after(5):
                await woken.wait()
                await again.wait()
            tg.cancel_scope.cancel()
    [record] = [r for r in caplog.records if r.name == "streamjobs._cluster_waiter"]
    assert record.levelname == "WARNING"
    assert "ConnectionError: Connection closed by server." in record.getMessage()
    assert record.exc_info is None
