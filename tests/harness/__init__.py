"""The test suite's pytest plugin and the helpers behind it.

``tests/conftest.py`` registers :mod:`tests.harness.plugin`, which defines every
shared fixture. The other modules hold what those fixtures are built from:

* :mod:`~tests.harness.sources`: where Redis and Redis Cluster come from (an URL
  in the environment, a private server, Docker), and when their absence is a skip
  or a failure;
* :mod:`~tests.harness.cluster`: where a cluster fixture connects (the private
  :class:`streamjobs.testing.LocalCluster`, or a cluster named in the environment)
  and how a test closes its cluster client;
* :mod:`~tests.harness.keys`: cleanup of a test's keys on a shared server.

Processes (private servers, the cluster, worker fleets) come from :mod:`streamjobs.testing`,
the same module users get.
"""
