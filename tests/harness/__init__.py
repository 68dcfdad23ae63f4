"""The test suite's pytest plugin and the helpers behind it.

``tests/conftest.py`` registers :mod:`tests.harness.plugin`, which defines every
shared fixture. The other modules hold what those fixtures are built from:

* :mod:`~tests.harness.sources`: where Redis and Redis Cluster come from (an URL
  in the environment, a private server, Docker), and when their absence is a skip
  or a failure;
* :mod:`~tests.harness.cluster`: :class:`~tests.harness.cluster.LocalCluster`, a
  real 3 + 3 OSS cluster made of :class:`streamjobs.testing.RedisServer` nodes;
* :mod:`~tests.harness.keys`: cleanup of a test's keys on a shared server.

Processes (private servers, worker fleets) come from :mod:`streamjobs.testing`,
the same module users get.
"""
