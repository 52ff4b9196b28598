"""Fault switches and the rate limiter: state the routes consult, flipped by the control API."""

import math
from dataclasses import dataclass, field

import anyio

from loopd_dev.fakes.mattermost.clock import Clock


@dataclass(frozen=True)
class RateDecision:
    allowed: bool
    headers: dict[str, str]


@dataclass
class RateLimiter:
    """``RateLimitSettings`` (off by default): a GCRA bucket per key, as the real server's
    throttled limiter. It allows ``burst + 1`` requests at once, then ``per_second``."""

    clock: Clock
    enabled: bool = False
    per_second: float = 10.0
    burst: int = 100
    _theoretical_arrival: dict[str, float] = field(default_factory=dict)

    def check(self, key: str) -> RateDecision:
        if not self.enabled:
            return RateDecision(True, {})
        now = self.clock.monotonic()
        interval = 1.0 / self.per_second
        tolerance = interval * self.burst
        tat = max(self._theoretical_arrival.get(key, now), now)
        new_tat = tat + interval
        allow_at = new_tat - tolerance - interval
        limit = self.burst + 1
        if now < allow_at:
            retry_after = allow_at - now
            headers = self._headers(limit, 0, tat - now)
            headers["Retry-After"] = str(max(1, math.ceil(retry_after)))
            return RateDecision(False, headers)
        self._theoretical_arrival[key] = new_tat
        remaining = int((now - (new_tat - tolerance - interval)) / interval)
        return RateDecision(True, self._headers(limit, max(0, remaining), new_tat - now))

    @staticmethod
    def _headers(limit: int, remaining: int, reset_after: float) -> dict[str, str]:
        return {
            "X-RateLimit-Limit": str(limit),
            "X-RateLimit-Remaining": str(remaining),
            "X-RateLimit-Reset": str(max(0, math.ceil(reset_after))),
        }


class StallGate:
    """Open by default; while closed, socket writers wait at it."""

    def __init__(self) -> None:
        self._closed = False
        self._waiters: list[anyio.Event] = []

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        self._closed = True

    def open(self) -> None:
        self._closed = False
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            waiter.set()

    async def wait_open(self) -> None:
        while self._closed:
            waiter = anyio.Event()
            self._waiters.append(waiter)
            await waiter.wait()


@dataclass
class Faults:
    """Switches that make the fake misbehave on purpose. All off by default."""

    stall_gate: StallGate = field(default_factory=StallGate)  # closed: writers and replies stop
    forced_429: int = 0  # next requests answered 429 regardless of the limiter
    forced_429_retry_after_s: int = 1
    failing_creates: int = 0  # next POST /posts commit, then answer this status
    failing_create_status: int = 500
    hanging_creates: int = 0  # next POST /posts commit, then their answer never comes
    refused_patches: int | None = None  # while set, every post patch answers this status

    @property
    def stalled(self) -> bool:
        return self.stall_gate.closed

    def take_forced_429(self) -> int | None:
        """Retry-After seconds if this request must be refused by a 429 burst."""
        if self.forced_429 <= 0:
            return None
        self.forced_429 -= 1
        return self.forced_429_retry_after_s

    def take_failing_create(self) -> int | None:
        """The status to answer after committing this create, if it must fail."""
        if self.failing_creates <= 0:
            return None
        self.failing_creates -= 1
        return self.failing_create_status

    def take_hanging_create(self) -> bool:
        """Whether this create, already committed, must never be answered."""
        if self.hanging_creates <= 0:
            return False
        self.hanging_creates -= 1
        return True
