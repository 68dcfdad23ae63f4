"""Assignment input that can never be run is refused as unparseable, never a crash:
a value nested too deep for the JSON parser, a stream name under the framework's own
key prefix."""

from __future__ import annotations

import pytest

from streamjobs import InvalidAssignment, InvalidStreamName
from streamjobs._keys import Keys
from streamjobs._wire import parse_assignment


def test_deeply_nested_json_is_unparseable_not_a_crash() -> None:
    with pytest.raises(InvalidAssignment, match="RecursionError"):
        parse_assignment("1-0", {"stream": "s", "info": "[" * 100_000})


def test_names_under_the_key_prefix_are_reserved() -> None:
    keys = Keys("svc")
    for name in (keys.assignments, keys.dead_letters, keys.leases, keys.lock("x"), "streamjobs:"):
        with pytest.raises(InvalidStreamName, match="reserved"):
            keys.check_data_stream(name)
        with pytest.raises(InvalidAssignment, match="reserved"):
            parse_assignment("1-0", {"stream": name}, keys)
    keys.check_data_stream("streamjobs-like:but:not:ours")
