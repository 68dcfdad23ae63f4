"""The errors of :class:`~streamjobs.testing.LocalCluster`."""

from __future__ import annotations

from typing import Final

from ..exceptions import StreamJobsError

SLOT_COUNT: Final = 16384


class ClusterError(StreamJobsError, RuntimeError):
    """The local cluster did not reach or keep the state a caller asked for."""


class ClusterStartupError(ClusterError):
    """The cluster could not be started; the message carries the nodes' log tails."""
