"""``after_failure()``: what happens after a ``handle()`` call raised (a pure function)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamjobs import DeadLetter, Retry
from streamjobs._pipeline import GiveUp, RetryAfter, after_failure

BACKOFF_S = 0.1
CAP_S = 5.0


def decide(error: BaseException, attempt: int, max_attempts: int = 3) -> RetryAfter | GiveUp:
    return after_failure(
        error, attempt, max_attempts=max_attempts, backoff_s=BACKOFF_S, backoff_max_s=CAP_S
    )


@pytest.mark.parametrize(
    ("error", "attempt", "max_attempts", "expected"),
    [
        # DeadLetter gives up at any attempt, with its reason.
        (DeadLetter("bad input"), 1, 3, GiveUp("DeadLetter: bad input", "bad input")),
        (DeadLetter("bad input"), 3, 3, GiveUp("DeadLetter: bad input", "bad input")),
        (DeadLetter("late"), 9, 3, GiveUp("DeadLetter: late", "late")),
        (
            DeadLetter(),
            1,
            3,
            GiveUp("DeadLetter: dead-lettered by handler", "dead-lettered by handler"),
        ),
        # Retry waits its own delay (not capped by the backoff cap) while attempts remain.
        (Retry(0.5), 1, 3, RetryAfter(0.5)),
        (Retry(), 2, 3, RetryAfter(0.0)),
        (Retry(60), 1, 3, RetryAfter(60)),
        (Retry(0.5), 3, 3, GiveUp("Retry: retry in 0.5s")),
        # Anything else backs off exponentially from handler_backoff_s, capped.
        (ValueError("boom"), 1, 10, RetryAfter(0.1)),
        (ValueError("boom"), 2, 10, RetryAfter(0.2)),
        (ValueError("boom"), 3, 10, RetryAfter(0.4)),
        (ValueError("boom"), 6, 10, RetryAfter(3.2)),
        (ValueError("boom"), 7, 10, RetryAfter(CAP_S)),
        (ValueError("boom"), 9, 10, RetryAfter(CAP_S)),
        (KeyError("k"), 10_000, 10**9, RetryAfter(CAP_S)),  # no overflow far out
        # The last attempt gives up with "Type: message".
        (ValueError("boom"), 3, 3, GiveUp("ValueError: boom")),
        (ValueError("boom"), 4, 3, GiveUp("ValueError: boom")),
        (RuntimeError(), 1, 1, GiveUp("RuntimeError: ")),
        (KeyError("k"), 2, 2, GiveUp("KeyError: 'k'")),
    ],
)
def test_after_failure_table(
    error: Exception, attempt: int, max_attempts: int, expected: RetryAfter | GiveUp
) -> None:
    step = decide(error, attempt, max_attempts)
    if isinstance(expected, RetryAfter):
        assert isinstance(step, RetryAfter)
        assert step.delay_s == pytest.approx(expected.delay_s)
    else:
        assert step == expected


def test_zero_backoff_retries_at_once() -> None:
    step = after_failure(OSError("x"), 5, max_attempts=10, backoff_s=0.0, backoff_max_s=CAP_S)
    assert step == RetryAfter(0.0)


def test_cap_below_base_wins() -> None:
    step = after_failure(OSError("x"), 1, max_attempts=10, backoff_s=2.0, backoff_max_s=0.5)
    assert step == RetryAfter(0.5)


# -- properties ----------------------------------------------------------------------------

ordinary_errors = st.builds(
    lambda cls, msg: cls(msg),
    st.sampled_from([ValueError, RuntimeError, OSError, KeyError, TimeoutError, Exception]),
    st.text(max_size=20),
)
any_errors = st.one_of(
    ordinary_errors,
    st.builds(Retry, st.floats(0, 1e6, allow_nan=False, allow_infinity=False)),
    st.builds(DeadLetter, st.text(max_size=20)),
)
attempts = st.integers(1, 200)
delays = st.floats(0, 1e6, allow_nan=False, allow_infinity=False)


@given(ordinary_errors, attempts, attempts, delays, delays)
def test_ordinary_error_delay_is_between_zero_and_the_cap(
    error: Exception, attempt: int, max_attempts: int, backoff_s: float, cap_s: float
) -> None:
    step = after_failure(
        error, attempt, max_attempts=max_attempts, backoff_s=backoff_s, backoff_max_s=cap_s
    )
    if isinstance(step, RetryAfter):
        assert 0 <= step.delay_s <= cap_s


@given(any_errors, attempts, attempts, delays, delays)
def test_gives_up_exactly_when_attempts_are_used_up_or_on_dead_letter(
    error: Exception, attempt: int, max_attempts: int, backoff_s: float, cap_s: float
) -> None:
    step = after_failure(
        error, attempt, max_attempts=max_attempts, backoff_s=backoff_s, backoff_max_s=cap_s
    )
    expect_give_up = isinstance(error, DeadLetter) or attempt >= max_attempts
    assert isinstance(step, GiveUp) == expect_give_up
    if isinstance(step, GiveUp):
        prefix = "DeadLetter: " if isinstance(error, DeadLetter) else f"{type(error).__name__}: "
        assert step.error.startswith(prefix)
    elif isinstance(error, Retry):
        assert step.delay_s == error.delay_s
    else:
        assert step.delay_s >= 0


@given(ordinary_errors, st.integers(1, 199), delays, delays)
def test_ordinary_error_delays_never_shrink_as_attempts_grow(
    error: Exception, attempt: int, backoff_s: float, cap_s: float
) -> None:
    def delay(n: int) -> float:
        step = after_failure(error, n, max_attempts=1000, backoff_s=backoff_s, backoff_max_s=cap_s)
        assert isinstance(step, RetryAfter)
        return step.delay_s

    assert delay(attempt) <= delay(attempt + 1)
