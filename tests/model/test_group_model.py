"""The stateful model of a shared group, over the in-memory gateway
(tests/harness/group_model.py): two members of one service's group on two streams,
through appends (taken, refused once, rejected), kills, stalls past the session TTL,
graceful stops, restarts and a failing group step, before it runs or after.

The bounded run here is part of every test run and explores the same examples every
time. The long run explores new ones:

    STREAMJOBS_MODEL_EXAMPLES=100 STREAMJOBS_MODEL_STEPS=30 \\
        .venv/bin/python -m pytest tests/model/test_group_model.py -q -p no:logging
"""

from __future__ import annotations

import os

import pytest

from tests.harness.group_model import run

LONG_RUN = "STREAMJOBS_MODEL_EXAMPLES" in os.environ
EXAMPLES = int(os.environ.get("STREAMJOBS_MODEL_EXAMPLES", "6"))
STEPS = int(os.environ.get("STREAMJOBS_MODEL_STEPS", "15"))


@pytest.mark.timeout(0 if LONG_RUN else 600)
def test_the_group_model() -> None:
    run(EXAMPLES, STEPS, derandomize=not LONG_RUN)
