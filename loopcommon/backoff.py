"""How long to wait before trying again: the one backoff rule of loopd and brokerd. Pure: no
I/O, no clock; the caller counts the failures, draws the random number (or lets ``jittered``
draw it) and does the waiting (``loopcommon.retry`` for a retried call, a sleep for a loop).

After ``n`` failures in a row the wait is ``first_s * factor ** (n - 1)``, at most ``cap_s``;
with ``jitter`` a random share of it, up to that fraction, is taken off, so that clients that
failed together do not come back together. Nothing waits longer than its unjittered delay.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Final


@dataclass(frozen=True)
class Backoff:
    first_s: float  # the wait after the first failure
    cap_s: float  # the longest wait
    factor: float = 2.0  # each further failure in a row multiplies the wait by this
    jitter: float = 0.0  # the largest share of a wait taken off at random (0: none, 1: all)

    def __post_init__(self) -> None:
        if self.first_s < 0 or self.cap_s < 0:
            raise ValueError(f"a backoff's waits are not negative: {self}")
        if self.factor < 1:
            raise ValueError(f"a backoff's waits do not shrink: factor {self.factor}")
        if not 0 <= self.jitter <= 1:
            raise ValueError(f"a backoff's jitter is a share, 0 to 1: {self.jitter}")

    def delay(self, failures: int) -> float:
        """The wait after ``failures`` failures in a row (1: the first), without jitter."""
        wait = min(self.first_s, self.cap_s)
        # Grown step by step rather than raised to a power: a count of failures that only grows
        # (a server down for days) would overflow a float; this stops growing at the cap.
        for _ in range(failures - 1):
            grown = min(self.cap_s, wait * self.factor)
            if grown == wait:
                break
            wait = grown
        return wait

    def jittered(self, failures: int, rand: Callable[[], float] = random.random) -> float:
        """``delay`` less a random share of it, up to ``jitter``; ``rand`` draws from [0, 1)."""
        return self.delay(failures) * (1.0 - self.jitter * rand())

    def capped_at(self, cap_s: float) -> Backoff:
        """The same rule with another longest wait."""
        return replace(self, cap_s=cap_s)


# The first re-check of something found down (an endpoint whose self-test failed, a self-test
# that could not tell because a probe failed on the way): 2 s. A server that only dropped a
# connection, or a small model the router reloads, is back by then, so a short first wait gets
# the endpoint serving again soonest; one that takes longer costs one more cheap check, at 2 + 4
# s, than a first wait of 5 s would have. Doubling keeps a dead server's cost low.
RECHECK_FIRST_S: Final = 2.0
# A server that comes back is found within a minute; a dead one costs a failed check a minute.
RECHECK: Final = Backoff(first_s=RECHECK_FIRST_S, cap_s=60.0)
