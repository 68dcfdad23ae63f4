"""The Redis boundary's translation of client errors: an internal error of the client
and a slot moved in a failover are transient failures, not broken streams."""

from __future__ import annotations

import pytest
import redis.exceptions as rex

from streamjobs import RedisUnavailable
from streamjobs._redis import UnexpectedClientError, translate, translated
from streamjobs.exceptions import ScriptError

pytestmark = pytest.mark.anyio


async def test_the_boundary_turns_a_client_internal_error_into_a_transient_failure() -> None:
    @translated
    async def command() -> None:
        raise AttributeError("'NoneType' object has no attribute 'writelines'")

    with pytest.raises(UnexpectedClientError) as caught:
        await command()
    assert isinstance(caught.value, RedisUnavailable)
    assert isinstance(caught.value.__cause__, AttributeError)


@pytest.mark.parametrize(
    "error",
    [
        rex.MovedError("2447 127.0.0.1:17981"),  # redis-py strips the "MOVED " prefix
        rex.AskError("2447 127.0.0.1:17981"),
        rex.ResponseError("MOVED 2447 127.0.0.1:17981"),
    ],
)
@pytest.mark.parametrize("in_script", [True, False])
def test_a_slot_moved_in_a_failover_is_transient_not_a_broken_stream(
    error: Exception, in_script: bool
) -> None:
    """The cluster soak dead-lettered two assignments in a failover: a MOVED reply to
    the fenced read's own transaction came back as redis-py's MovedError, whose message
    has no "MOVED" prefix, and was taken for a script failure (PERMANENT). A dead
    assignment leaves the job's unread rest to the next job of the name."""
    out = translate(error, in_script=in_script)
    assert isinstance(out, RedisUnavailable), out
    assert not isinstance(out, ScriptError)
