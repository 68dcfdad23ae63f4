"""How a background loop survives a failure: log it, count it, back off, carry on.

Every loop of a consumer (intake, heartbeat, each stream, the lease sweep, the scan,
subscriptions, the cluster watcher) runs until cancelled. A failure of one iteration,
whatever its type, must never end ``run()``: Redis being away is expected and logged
in one line; anything else (a redis-py internal error during a failover, a bug) is
logged with its traceback so it can be found and fixed. Cancellation is never caught.
"""

from __future__ import annotations

import logging

import anyio

from ._backoff import Backoff
from ._redis._boundary import REDIS_FAILURES, UnexpectedClientError
from .metrics import MetricsRecorder


def is_expected(exc: BaseException) -> bool:
    """True for a Redis failure the boundary classified (no traceback needed)."""
    return isinstance(exc, REDIS_FAILURES) and not isinstance(exc, UnexpectedClientError)


Logger = logging.Logger | logging.LoggerAdapter[logging.Logger]


def log_failure(logger: Logger, what: str, exc: BaseException, delay_s: float) -> None:
    """One line for an expected Redis failure, the traceback for anything else."""
    if is_expected(exc):
        logger.warning("%s: %s; retrying in %.2fs", what, exc, delay_s)
    else:
        logger.error(
            "%s failed unexpectedly (%s); retrying in %.2fs",
            what,
            type(exc).__name__,
            delay_s,
            exc_info=exc,
        )


class LoopGuard:
    """The failure policy of one loop.

    Args:
        loop: the loop's name, as counted by ``MetricsRecorder.loop_error``.
        service: the service name (a metrics label).
        metrics: where failures are counted.
        logger: where they are logged.
        cap_s: the longest back-off.
    """

    def __init__(
        self,
        loop: str,
        service: str,
        metrics: MetricsRecorder,
        logger: logging.Logger,
        *,
        cap_s: float = 5.0,
    ) -> None:
        self.loop = loop
        self._service = service
        self._metrics = metrics
        self._log = logger
        self._backoff = Backoff(cap_s=cap_s)

    def ok(self) -> None:
        """An iteration succeeded: the next failure backs off from the start."""
        self._backoff.reset()

    def record(self, exc: BaseException, what: str = "") -> float:
        """Count and log a failure; returns the delay to wait before retrying."""
        self._metrics.loop_error(self._service, self.loop)
        delay = self._backoff.next_delay()
        log_failure(self._log, what or self.loop, exc, delay)
        return delay

    async def failed(self, exc: BaseException, what: str = "") -> None:
        """Count and log a failure, then back off."""
        await anyio.sleep(self.record(exc, what))
