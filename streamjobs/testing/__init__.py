"""Real processes for tests and demos: a throw-away Redis, a cluster, a fleet of workers.

This module is for code that exercises streamjobs against real processes rather
than mocks: your own integration and fault tests, demos, benchmarks, and this
project's test suite. It offers three things:

* :class:`RedisServer`: a private ``redis-server`` run as a foreground child on
  127.0.0.1, with its own directory and log file. It can crash (:meth:`~RedisServer.kill`)
  and come back with what its append-only file holds, be paused, restarted, and
  serve as one node of a cluster a test assembles itself.
* :class:`LocalCluster`: six such servers joined into a 3 primaries + 3 replicas OSS
  Redis Cluster in about two seconds, whose nodes can be killed, restarted and failed
  over (:meth:`~LocalCluster.kill_node`, :meth:`~LocalCluster.graceful_failover`).
* :class:`WorkerFleet`: ``streamjobs worker MODULE:CLASS`` subprocesses, one log
  file each, that can be signalled, killed, or stopped gracefully.

And one thing for tests that need no server at all: :func:`fake_redis`, an in-memory
client (fakeredis with Lua, the ``testing`` extra) for unit tests of your own
consumers (docs/testing.md).

Its own imports are the standard library, redis-py and the exception tree: nothing
here depends on the consumer runtime, whose behaviour these processes are meant to
check from outside.
``import streamjobs`` does not load it; import ``streamjobs.testing`` explicitly.

Example::

    from streamjobs.testing import RedisServer, WorkerFleet

    with (
        RedisServer(appendonly=True) as server,
        WorkerFleet(server.url, "billing", "myapp.workers:Billing") as fleet,
    ):
        victim = fleet.start("w0")
        fleet.start("w1")
        fleet.wait_started()
        ...  # queue work with streamjobs.Producer
        victim.kill()  # SIGKILL: w1 must recover w0's streams
        server.kill()  # a Redis crash; start() brings it back from the AOF
        server.start()

Every process started here is also killed when the interpreter exits, in case its
owner could not stop it; that is a safety net, not a replacement for ``stop()``.
"""

from ._cluster import LocalCluster
from ._cluster_errors import ClusterError, ClusterStartupError
from ._fleet import Worker, WorkerFleet
from ._memory import fake_redis
from ._process import (
    HOST,
    RESERVED_PORTS,
    SERVER_ENV_VAR,
    PortInUseError,
    RedisServerError,
    WorkerError,
    answers,
    bundled_server,
    free_port,
    server_binary,
)
from ._script import redis_for_script
from ._server import RedisServer

__all__ = (
    "HOST",
    "RESERVED_PORTS",
    "SERVER_ENV_VAR",
    "ClusterError",
    "ClusterStartupError",
    "LocalCluster",
    "PortInUseError",
    "RedisServer",
    "RedisServerError",
    "Worker",
    "WorkerError",
    "WorkerFleet",
    "answers",
    "bundled_server",
    "fake_redis",
    "free_port",
    "redis_for_script",
    "server_binary",
)
