"""``streamjobs.testing.fake_redis()``, the in-memory client of docs/testing.md: each
call is a server of its own, and a missing extra says what to install (the example of
docs/testing.md run as a user runs it: tests/tools/test_testing_example.py)."""

from __future__ import annotations

import pytest

from streamjobs.testing import fake_redis


def test_two_clients_are_two_servers() -> None:
    import anyio

    async def check() -> None:
        one, two = fake_redis(), fake_redis()
        await one.set("k", "1")
        assert await two.get("k") is None
        assert (await one.info("memory"))["maxmemory_policy"] == "noeviction"

    anyio.run(check)


def test_a_missing_fakeredis_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "lupa" else real(name, *a)
    )
    with pytest.raises(ImportError, match=r"lupa missing\): pip install 'streamjobs\[testing\]'"):
        fake_redis()
