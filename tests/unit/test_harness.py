"""Unit tests of the harness's pure logic (no Redis, no network; where it touches the
network: tests/tools/test_harness_network.py)."""

from __future__ import annotations

import pytest

from tests.harness.keys import glob_escape
from tests.harness.sources import choose_redis_source

URL = "redis://127.0.0.1:7000/0"


@pytest.mark.parametrize(
    ("env", "has_binary", "has_docker", "expected"),
    [
        # an explicit URL wins over everything
        ({"STREAMJOBS_TEST_REDIS_URL": URL}, True, True, "env"),
        ({"STREAMJOBS_TEST_REDIS_URL": URL}, False, False, "env"),
        ({"STREAMJOBS_TEST_REDIS_URL": URL, "CI": "true"}, False, False, "env"),
        # a blank URL counts as unset
        ({"STREAMJOBS_TEST_REDIS_URL": "  "}, True, False, "spawn"),
        # then a private redis-server
        ({}, True, True, "spawn"),
        ({}, True, False, "spawn"),
        ({"CI": "true"}, True, False, "spawn"),
        # then Docker
        ({}, False, True, "docker"),
        ({"CI": "true"}, False, True, "docker"),
        # nothing: skip locally ...
        ({}, False, False, "skip"),
        ({"CI": ""}, False, False, "skip"),
        ({"CI": "false"}, False, False, "skip"),
        ({"CI": "0"}, False, False, "skip"),
        ({"STREAMJOBS_TEST_REDIS_URL": ""}, False, False, "skip"),
        # ... but fail under CI=true, in any case
        ({"CI": "true"}, False, False, "fail"),
        ({"CI": "TRUE"}, False, False, "fail"),
        ({"CI": "True"}, False, False, "fail"),
        ({"CI": " true "}, False, False, "fail"),
        ({"CI": "true", "STREAMJOBS_TEST_REDIS_URL": ""}, False, False, "fail"),
    ],
)
def test_choose_redis_source(
    env: dict[str, str], has_binary: bool, has_docker: bool, expected: str
) -> None:
    assert choose_redis_source(env, has_binary, has_docker) == expected


def test_conftest_registers_the_harness_plugin() -> None:
    from tests import conftest

    assert conftest.pytest_plugins == ("tests.harness.plugin",)


@pytest.mark.parametrize(
    ("raw", "escaped"),
    [
        ("0123abcdef", "0123abcdef"),
        ("{svc-1}", "{svc-1}"),
        ("a*b?c", "a\\*b\\?c"),
        ("[x]", "\\[x\\]"),
        ("back\\slash", "back\\\\slash"),
    ],
)
def test_glob_escape(raw: str, escaped: str) -> None:
    assert glob_escape(raw) == escaped
