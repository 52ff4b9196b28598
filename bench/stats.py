"""Summaries of repeated measurements. Pure."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Spread:
    """Minimum, median and maximum of ``count`` repeated runs."""

    minimum: float
    median: float
    maximum: float
    count: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        if not values:
            raise ValueError("a spread needs at least one value")
        return cls(min(values), statistics.median(values), max(values), len(values))


def percentile(values: Sequence[float], fraction: float) -> float:
    """The nearest-rank percentile (``fraction`` 0.99 for p99): always one of the values."""
    if not values:
        raise ValueError("a percentile needs at least one value")
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    ordered = sorted(values)
    return ordered[max(math.ceil(fraction * len(ordered)) - 1, 0)]
