"""Save when it pays (``loopd.engine.saverule``), on the figures the bench measured: a save is
skipped where a return would gain less than it costs (the tiny presets with their caches kept),
made where a re-read is long (production's 30,000-token thread), and made while a figure is not
measured yet."""

from __future__ import annotations

import pytest

from loopd.engine.saverule import (
    MIN_READ_TOKENS,
    SaveFigures,
    StateSize,
    decide,
    fit_size,
)


def test_two_lengths_separate_the_fixed_state_from_the_state_per_token() -> None:
    # The bench's saves (bench/results, the durable section): SmolLM2 and the hybrid preset.
    dense = fit_size([(352, 8_116_488), (788, 18_168_904)])
    assert dense is not None
    assert dense.bytes_per_token == pytest.approx(23_056, abs=1)
    assert dense.fixed_bytes == pytest.approx(776, abs=5)
    hybrid = fit_size([(450, 613_808), (1006, 1_198_720)])
    assert hybrid is not None
    assert hybrid.bytes_per_token == pytest.approx(1_052, abs=1)
    assert hybrid.fixed_bytes == pytest.approx(140_408, abs=50)
    assert fit_size([(100, 2_000)]) == StateSize(0.0, 20.0)
    assert fit_size([]) is None


def measured(
    *, tokens_per_s: float, returns: int, lost: int, sizes: list[tuple[int, int]]
) -> SaveFigures:
    figures = SaveFigures()
    figures.read(int(tokens_per_s), 1000.0)
    for tokens, n_bytes in sizes:
        figures.saved(tokens, n_bytes, ms=n_bytes / 1e6, prefix_read_ms=33.0)  # 1 GB/s
    figures.restored(10_000_000, 5.0)  # 2 GB/s
    for n in range(returns):
        figures.returned(1000, 1000 if n < lost else 0)
    return figures


def test_a_save_is_skipped_where_a_return_gains_less_than_the_save_costs() -> None:
    # The hybrid preset, warm: 2,342 tokens read at about 5,000 a second, and 20 returns that
    # all found their cache.
    figures = measured(
        tokens_per_s=5000, returns=20, lost=0, sizes=[(450, 613_808), (1006, 1_198_720)]
    )
    decision = decide(2342, figures)
    assert not decision.save
    assert decision.chance_lost == pytest.approx(1 / 22)
    assert decision.reread_s == pytest.approx(0.4684)
    assert "a return re-reads 2342 tokens in 0.468 s" in decision.reason
    assert decision.extra()["decision"] == "skip"


def test_a_save_is_made_where_a_re_read_is_long() -> None:
    # Production's long thread: 30,000 tokens at about 870 a second, most returns warm.
    figures = measured(
        tokens_per_s=870, returns=50, lost=2, sizes=[(1000, 60_000_000), (4000, 120_000_000)]
    )
    decision = decide(30_000, figures)
    assert decision.save, decision.reason
    assert decision.reread_s == pytest.approx(34.48, abs=0.01)


def test_a_save_is_made_where_most_returns_find_their_session_lost() -> None:
    # The soak's two slots for forty threads: almost every return finds another session there.
    figures = measured(tokens_per_s=1500, returns=30, lost=28, sizes=[(600, 13_800_000)])
    assert decide(600, figures).save


def test_a_figure_not_measured_yet_is_measured_by_a_save() -> None:
    decision = decide(500, SaveFigures())
    assert decision.save
    assert decision.reason.startswith("not measured yet: the server's prompt speed, a state's")
    assert decide(0, SaveFigures()).save is False


def test_short_reads_do_not_set_the_prompt_speed() -> None:
    figures = SaveFigures()
    figures.read(MIN_READ_TOKENS - 1, 1.0)
    figures.read(None, 5.0)
    assert figures.prompt_tokens_per_s is None
    figures.read(1000, 500.0)
    figures.read(1000, 250.0)
    assert figures.prompt_tokens_per_s == pytest.approx(2000 + 0.3 * 2000)


def test_a_return_counts_as_lost_from_half_of_what_was_expected() -> None:
    figures = SaveFigures()
    figures.returned(0, 0)  # nothing was expected: not a return
    figures.returned(100, 49)
    figures.returned(100, 50)
    assert (figures.returns, figures.lost_returns) == (2, 1)
    assert figures.chance_lost == pytest.approx(0.5)
