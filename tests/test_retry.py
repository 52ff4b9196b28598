"""The one backoff rule and the retried call built on it: the waits, the stops, the errors."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tenacity import retry_if_exception_type, retry_if_result

from loopcommon.backoff import RECHECK, RECHECK_FIRST_S, Backoff
from loopcommon.retry import AT_ONCE, retrying


class Passing(Exception):
    """A failure worth another try."""


class Told(Passing):
    def __init__(self, after_s: float) -> None:
        super().__init__(f"retry after {after_s}")
        self.after_s = after_s


def test_the_waits_double_up_to_the_cap() -> None:
    backoff = Backoff(first_s=0.5, cap_s=10.0)
    assert [backoff.delay(n) for n in range(1, 8)] == [0.5, 1, 2, 4, 8, 10, 10]


def test_the_recheck_rule_starts_at_its_one_first_delay_and_stops_at_a_minute() -> None:
    assert RECHECK_FIRST_S == 2.0
    assert [RECHECK.delay(n) for n in range(1, 9)] == [2, 4, 8, 16, 32, 60, 60, 60]
    # A caller with a longer cap (the daemon's self-test interval) keeps the same start.
    assert [RECHECK.capped_at(3600.0).delay(n) for n in (1, 2, 12, 13)] == [2, 4, 3600, 3600]


def test_a_cap_below_the_first_wait_wins() -> None:
    assert Backoff(first_s=2.0, cap_s=0.1).delay(1) == 0.1


def test_a_count_of_failures_that_only_grows_does_not_overflow() -> None:
    assert Backoff(first_s=1.0, cap_s=60.0).delay(10**6) == 60.0
    assert Backoff(first_s=1.0, cap_s=60.0, factor=1.0).delay(10**6) == 1.0
    assert AT_ONCE.delay(10**6) == 0.0


@pytest.mark.parametrize(
    "bad",
    [
        {"first_s": -1.0, "cap_s": 1.0},
        {"first_s": 1.0, "cap_s": 1.0, "factor": 0.5},
        {"first_s": 1.0, "cap_s": 1.0, "jitter": 1.5},
    ],
)
def test_a_backoff_that_makes_no_sense_is_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="backoff"):
        Backoff(**bad)


@given(
    first=st.floats(0.0, 100.0),
    cap=st.floats(0.0, 1000.0),
    factor=st.floats(1.0, 4.0),
    jitter=st.floats(0.0, 1.0),
    failures=st.integers(1, 200),
    draw=st.floats(0.0, 1.0, exclude_max=True),
)
def test_a_wait_grows_never_passes_the_cap_and_jitter_only_takes_off(
    first: float, cap: float, factor: float, jitter: float, failures: int, draw: float
) -> None:
    backoff = Backoff(first, cap, factor, jitter)
    delay = backoff.delay(failures)
    assert 0.0 <= delay <= cap
    assert backoff.delay(failures + 1) >= delay
    assert delay * (1 - jitter) <= backoff.jittered(failures, lambda: draw) <= delay


def test_a_zero_draw_waits_the_whole_delay_and_the_largest_takes_off_the_jitter() -> None:
    backoff = Backoff(first_s=4.0, cap_s=60.0, jitter=0.5)
    assert backoff.jittered(1, lambda: 0.0) == 4.0
    assert backoff.jittered(2, lambda: 1.0) == 4.0  # 8 s, less half


class Waits:
    """tenacity's sleep, recorded instead of slept."""

    def __init__(self) -> None:
        self.seconds: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.seconds.append(seconds)


def flaky(failures: list[BaseException]) -> tuple[list[int], Callable[[], Awaitable[str]]]:
    calls: list[int] = []

    async def call() -> str:
        calls.append(1)
        if failures:
            raise failures.pop(0)
        return "done"

    return calls, call


@pytest.mark.anyio
async def test_a_call_is_tried_again_by_the_backoff_until_it_succeeds() -> None:
    waits = Waits()
    calls, call = flaky([Passing(), Passing(), Passing()])
    attempts = retrying(
        Backoff(first_s=1.0, cap_s=3.0), retry_if_exception_type(Passing), sleep=waits
    )
    assert await attempts(call) == "done"
    assert (len(calls), waits.seconds) == (4, [1.0, 2.0, 3.0])


@pytest.mark.anyio
async def test_after_the_last_attempt_the_callers_own_error_comes_out() -> None:
    waits = Waits()
    calls, call = flaky([Passing("one"), Passing("two"), Passing("three")])
    attempts = retrying(AT_ONCE, retry_if_exception_type(Passing), attempts=2, sleep=waits)
    with pytest.raises(Passing, match="two"):
        await attempts(call)
    assert (len(calls), waits.seconds) == (2, [0.0])


@pytest.mark.anyio
async def test_an_error_not_worth_a_try_is_not_tried_again() -> None:
    waits = Waits()
    calls, call = flaky([KeyError("wrong")])
    attempts = retrying(AT_ONCE, retry_if_exception_type(Passing), sleep=waits)
    with pytest.raises(KeyError):
        await attempts(call)
    assert (len(calls), waits.seconds) == (1, [])


@pytest.mark.anyio
async def test_the_wait_a_failure_asks_for_is_kept_up_to_the_cap() -> None:
    waits = Waits()
    _calls, call = flaky([Told(0.25), Told(500.0), Passing()])
    attempts = retrying(
        Backoff(first_s=1.0, cap_s=30.0),
        retry_if_exception_type(Passing),
        told=lambda exc: exc.after_s if isinstance(exc, Told) else None,
        sleep=waits,
    )
    assert await attempts(call) == "done"
    assert waits.seconds == [0.25, 30.0, 4.0]  # the third failure asked nothing: the backoff's


@pytest.mark.anyio
async def test_a_retried_result_gives_the_last_one_when_attempts_run_out() -> None:
    waits = Waits()
    results = iter([1, 2, 3, 4])

    async def call() -> int:
        return next(results)

    attempts = retrying(
        AT_ONCE,
        retry_if_result(lambda n: n < 10),
        attempts=3,
        retry_error_callback=lambda state: state.outcome.result() if state.outcome else None,
        reraise=False,
        sleep=waits,
    )
    assert await attempts(call) == 3


@pytest.mark.anyio
async def test_a_window_of_zero_is_one_attempt() -> None:
    waits = Waits()
    calls, call = flaky([Passing("once"), Passing("twice")])
    attempts = retrying(AT_ONCE, retry_if_exception_type(Passing), within_s=0.0, sleep=waits)
    with pytest.raises(Passing, match="once"):
        await attempts(call)
    assert (len(calls), waits.seconds) == (1, [])
