"""Registers the suite's pytest plugin; every shared fixture lives in tests/harness/."""

from __future__ import annotations

pytest_plugins = ("tests.harness.plugin",)
