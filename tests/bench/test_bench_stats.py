"""Summaries of repeated runs."""

import pytest

from bench.stats import Spread, percentile


def test_spread_is_min_median_max_and_count() -> None:
    assert Spread.of([3.0, 1.0, 2.0, 10.0]) == Spread(1.0, 2.5, 10.0, 4)


def test_spread_of_nothing_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one"):
        Spread.of([])


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.5) == 50.0
    assert percentile(values, 0.99) == 99.0
    assert percentile(values, 1.0) == 100.0
    assert percentile([7.0], 0.99) == 7.0


@pytest.mark.parametrize("fraction", [0.0, 1.5, -0.1])
def test_percentile_outside_0_1_is_refused(fraction: float) -> None:
    with pytest.raises(ValueError, match="fraction"):
        percentile([1.0], fraction)
