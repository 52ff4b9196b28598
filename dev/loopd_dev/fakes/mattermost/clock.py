"""Time for the fake, injectable so tests jump over TTLs and reaper timeouts without sleeping."""

import time
from typing import Protocol


class Clock(Protocol):
    """Wall time (ms since epoch, for post times) and monotonic time (s, for TTLs and timeouts)."""

    def now_ms(self) -> int: ...

    def monotonic(self) -> float: ...


class SystemClock:
    """The real clocks."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic(self) -> float:
        return time.monotonic()


class ManualClock:
    """A clock that moves only when told to; both readings advance together."""

    def __init__(self, start_ms: int = 1_767_000_000_000) -> None:
        self._ms = start_ms
        self._mono = 1000.0

    def now_ms(self) -> int:
        return self._ms

    def monotonic(self) -> float:
        return self._mono

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"a clock cannot go back ({seconds} s)")
        self._ms += round(seconds * 1000)
        self._mono += seconds
