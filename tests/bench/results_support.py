"""Synthetic results for the report and plot tests."""

from __future__ import annotations

from dataclasses import replace

from bench.cache_reuse import CacheResult, CacheRow, SessionSettings
from bench.ideal import Label
from bench.machine import Machine
from bench.memory import MemorySample
from bench.overhead import CpuShare, LogCost
from bench.parsers import ParserRow
from bench.report import Results
from bench.stats import Spread
from bench.switching import SwitchRow
from loopd_dev.devserver import EVERY_TURN_MODEL, THINKING_MODEL


def spread(value: float) -> Spread:
    return Spread(value * 0.9, value, value * 1.1, 5)


def row(index: int, ideal: int, loopd: int, naive: int, label: Label = Label.NONE) -> CacheRow:
    return CacheRow(
        index=index,
        turn=1,
        after="tool result",
        reply="scripted",
        prompt_tokens=400 + index * 50,
        ideal=ideal,
        loopd_cache_n=400,
        loopd_prompt_n=loopd,
        naive_cache_n=300,
        naive_prompt_n=naive,
        label=label,
        counted_matches_server=True,
    )


def cache(rows: list[CacheRow] | None = None, model: str = THINKING_MODEL) -> CacheResult:
    rows = rows or [
        row(1, 400, 400, 400, Label.FIRST),
        row(2, 50, 51, 1500),
        row(3, 60, 120, 2000, Label.TEMPLATE_REWRITE),
        row(4, 40, 41, 2600),
    ]
    return CacheResult(rows, SessionSettings(model=model), [])


def every_turn_cache() -> CacheResult:
    rows = [row(1, 400, 400, 400, Label.FIRST), row(2, 50, 50, 1500), row(3, 45, 45, 2100)]
    return cache(rows, EVERY_TURN_MODEL)


def results(**changes: object) -> Results:
    base = Results(
        date="2026-11-29",
        started="2026-11-29 10:00:00",
        duration_s=300.0,
        machine=Machine("Test CPU @ 2 GHz", 2, 23.5, "3.11.7", "Linux 6"),
        load_before="0.10 / 0.20 / 0.30",
        load_after="1.00 / 0.50 / 0.40",
        repeats=5,
        reference_parser="line-by-line parser",
        parsers=[
            ParserRow("SSE", "as sent", "loopd SSEDecoder", spread(500_000)),
            ParserRow("SSE", "as sent", "line-by-line parser", spread(400_000)),
            ParserRow("events", "as sent", "loopd EventDecoder (typed events)", spread(30_000)),
            ParserRow("events", "as sent", "line-by-line parser + json.loads", spread(60_000)),
        ],
        log=LogCost(spread(4.0), spread(9.0), {100: spread(0.1), 10_000: spread(15.0)}, 200),
        memory=[MemorySample(100, 63.0, 64.2)] * 5,
        cpu=[CpuShare("whole turns", spread(0.004))],
        server="llama.cpp build 11434 (test)",
        caches=[cache(), every_turn_cache()],
        switching=[SwitchRow("smollm2", 2, 4, 4, spread(3), spread(20), spread(0.4))],
        plot_files=["2026-11-29-prompt-n-a.png", "2026-11-29-prompt-n-b.png"],
    )
    return replace(base, **changes)  # type: ignore[arg-type]
