"""A call tried again, by the one backoff rule (``loopcommon.backoff``), through tenacity.

``retrying`` is the ``AsyncRetrying`` every retried call of loopd and brokerd uses: it waits by
a ``Backoff``, stops after a number of attempts or a time (or never), and re-raises the last
error once it stops, so a caller sees its own exception rather than tenacity's ``RetryError``.
What is worth another try stays with the caller (``retry``): only it knows what cannot do harm.
Tests pass waits of zero or a few milliseconds; nothing here reads a clock of its own.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    stop_after_attempt,
    stop_after_delay,
    stop_any,
    stop_never,
)
from tenacity.retry import RetryBaseT
from tenacity.stop import StopBaseT, stop_base

from loopcommon.backoff import Backoff

# A dropped connection that never reached the server is sent again at once: the next one is a
# fresh connection, and there is nothing to wait out.
AT_ONCE = Backoff(first_s=0.0, cap_s=0.0)


def wait_of(
    backoff: Backoff,
    told: Callable[[BaseException], float | None] | None = None,
    rand: Callable[[], float] = random.random,
) -> Callable[[RetryCallState], float]:
    """tenacity's ``wait``: the backoff's (jittered) delay after the attempt that just failed,
    or the delay the failure itself asks for (``told``: an HTTP ``Retry-After``, say), at most
    the backoff's cap so that a server cannot park the caller."""

    def seconds(state: RetryCallState) -> float:
        error = state.outcome.exception() if state.outcome is not None else None
        asked = told(error) if told is not None and error is not None else None
        if asked is not None:
            return min(max(asked, 0.0), backoff.cap_s)
        return backoff.jittered(state.attempt_number, rand)

    return seconds


def stop_of(attempts: int | None = None, within_s: float | None = None) -> StopBaseT:
    """tenacity's ``stop``: after ``attempts`` attempts, or once ``within_s`` has passed since
    the first began (whichever comes first), or never when neither is given."""
    stops: list[stop_base] = []
    if attempts is not None:
        stops.append(stop_after_attempt(max(attempts, 1)))
    if within_s is not None:
        stops.append(stop_after_delay(within_s))
    return stop_any(*stops) if stops else stop_never


def retrying(
    backoff: Backoff,
    retry: RetryBaseT,
    *,
    attempts: int | None = None,
    within_s: float | None = None,
    told: Callable[[BaseException], float | None] | None = None,
    **options: Any,
) -> AsyncRetrying:
    """An ``AsyncRetrying`` that tries again while ``retry`` says so, waiting by ``backoff``
    (``wait_of``, with ``told``), until ``stop_of(attempts, within_s)``. ``options`` go to
    tenacity as they are (``before_sleep``, ``retry_error_callback``); ``reraise`` is on unless
    the caller turns it off."""
    options.setdefault("reraise", True)
    return AsyncRetrying(
        retry=retry,
        stop=stop_of(attempts, within_s),
        wait=wait_of(backoff, told),
        **options,
    )
