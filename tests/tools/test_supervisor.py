"""The ``--workers N`` supervisor's restart loop (streamjobs/_supervisor.py): a child
that cannot be started is retried with backoff, not the end of the supervisor."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import anyio
import pytest

from streamjobs import _supervisor
from streamjobs._supervisor import Supervisor

pytestmark = pytest.mark.anyio


async def test_a_child_that_cannot_be_started_is_tried_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_supervisor, "RESTART_BASE_S", 0.01)
    real = asyncio.create_subprocess_exec
    calls = 0

    async def spawn(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise OSError(11, "Resource temporarily unavailable")
        supervisor._stopping.set()  # this child is the last: stop once it exits
        return await real(*args, **kwargs)

    monkeypatch.setattr(asyncio, "create_subprocess_exec", spawn)
    supervisor = Supervisor(["m:C"], 1, None, None)
    supervisor._commands = [[sys.executable, "-c", "pass"]]
    with anyio.fail_after(30):
        await supervisor._keep(0)  # returns once the stop came and the child exited
    assert calls == 2
    assert supervisor._codes == {0: 0}, "the second attempt did not run the child"
