"""Markers set by folder: each folder's conftest.py marks every test collected under it
with what that folder's tests need (``redis``, ``faults``, ``cluster``, ``tools``), so
that ``-m`` selects by need without a mark in every file.

A conftest's ``pytest_collection_modifyitems`` sees the items of the whole session, so
it marks only those under its own folder. Marks a single test needs beyond its folder's
(``faults`` on one integration test, ``cluster`` on one parameter) stay on that test.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pytest


def mark_folder(items: Iterable[pytest.Item], folder: Path, *marks: pytest.MarkDecorator) -> None:
    """Add ``marks`` to every item whose file is under ``folder``."""
    for item in items:
        if item.path.is_relative_to(folder):
            for mark in marks:
                item.add_marker(mark)
