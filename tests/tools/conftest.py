"""Checks that run a tool or a process, or open a socket, and need no Redis: mypy and
ruff, the documentation build, the benchmark charts, the installed package seen from
another process, the CLI run as a command, the supervisor's child processes, the
harness's ports. Every test here is marked ``tools``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness.markers import mark_folder


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    mark_folder(items, Path(__file__).parent, pytest.mark.tools)
