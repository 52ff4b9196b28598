"""The report's plot: prompt_n per request of the cache session, loopd against the naive client."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.figure import Figure

from bench.cache_reuse import CacheRow
from bench.ideal import Label


def prompt_n_plot(rows: Sequence[CacheRow], path: Path, model: str) -> None:
    """Write a PNG: prompt_n per request (log scale), with the ideal and the labelled requests."""
    index = [row.index for row in rows]
    # A bare Figure, not pyplot: no global state, no display, nothing to close.
    figure = Figure(figsize=(10, 5), dpi=110)
    axes = figure.add_subplot()
    axes.plot(index, [row.naive_prompt_n for row in rows], "o-", label="naive client")
    axes.plot(index, [row.loopd_prompt_n for row in rows], "s-", label="loopd")
    axes.plot(index, [row.ideal for row in rows], "k--", linewidth=1, label="ideal")
    labelled = [row for row in rows if row.label not in (Label.NONE, Label.FIRST)]
    axes.scatter(
        [row.index for row in labelled],
        [row.loopd_prompt_n for row in labelled],
        s=120,
        facecolors="none",
        edgecolors="red",
        label="labelled (template drops reasoning, capped)",
    )
    axes.set_yscale("log")
    axes.set_xlabel("request")
    axes.set_ylabel("prompt_n (tokens processed, log scale)")
    axes.set_title(f"Prompt tokens processed per request, one {len(rows)}-request session, {model}")
    axes.set_xticks(index)
    axes.grid(True, which="both", alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, format="png")
