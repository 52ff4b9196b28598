"""The report holds what the issue asks for: command, machine, a table per benchmark, targets."""

from dataclasses import replace

from bench.cache_reuse import CUT_REPLY
from bench.ideal import Label
from bench.overhead import CpuShare
from bench.report import parser_ratios, render, targets
from tests.bench.results_support import cache, results, row, spread


def test_the_report_names_the_command_the_machine_and_the_date() -> None:
    text = render(results())
    assert text.startswith("# loopd benchmarks, 2026-11-29")
    assert "`make bench`" in text
    assert "2 cores (`nproc`), 23.5 GiB memory, Test CPU @ 2 GHz" in text
    assert "0.10 / 0.20 / 0.30" in text
    assert "min / median / max" in text


def test_a_run_of_its_own_says_its_command_and_its_start() -> None:
    text = render(
        results(command="python -m bench --production-shape --append", title="2026-11-29 21:10")
    )
    assert text.startswith("# loopd benchmarks, 2026-11-29 21:10\n")
    assert "- Command: `python -m bench --production-shape --append`, started" in text
    assert "`make bench`" not in text


def test_every_benchmark_has_its_table() -> None:
    text = render(results())
    for heading in (
        "## Cache reuse",
        "### Stream parser",
        "### Session log",
        "### CPU share of a turn",
        "### Memory with idle sessions",
        "## Thread switching on one slot",
    ):
        assert heading in text
    assert "| 3 | 1 | tool result | scripted | 550 | 60 | 400 | 120 | +60 | 300 | 2,000 | " in text
    assert "template drops reasoning" in text
    assert "## Cache reuse on `smollm2-think`" in text
    assert "## Cache reuse on `smollm2-think-all`" in text
    assert "![prompt_n per request on smollm2-think, loopd against naive]" in text
    assert "(2026-11-29-prompt-n-b.png)" in text
    assert "| naive | 4,000 | 8.1x loopd (8.1x the ideal) |" in text
    assert "| `smollm2` | 2 | 4 | 4 | 3 / 3 / 3 | 18 / 20 / 22 | 0.36 / 0.40 / 0.44 |" in text


def test_targets_are_judged_from_the_numbers() -> None:
    checks = {check.target: check for check in targets(results())}
    met = {target: check.met for target, check in checks.items()}
    assert list(met.values()) == [True, True, True, False, True, True, True]
    ratios = [c for t, c in checks.items() if t.startswith("the naive client")]
    assert [c.target.rsplit(" ", 1)[-1] for c in ratios] == [
        "(`smollm2-think`)",
        "(`smollm2-think-all`)",
    ]
    assert [c.measured for c in ratios] == ["10.6x (6,500 / 612)", "8.1x (4,000 / 495)"]


def test_a_labelled_row_is_no_miss_but_an_unlabelled_one_is() -> None:
    missed = cache([row(1, 400, 400, 400, Label.FIRST), row(2, 50, 90, 1500), row(3, 60, 200, 900)])
    assert [r.index for r in missed.misses()] == [2, 3]
    text = render(results(caches=[missed]))
    assert "| **no** |" in text
    assert "requests #2 (+40), #3 (+140)" in text
    assert "**+40**" in text


def test_shortfalls_say_why() -> None:
    slow = results(cpu=[], parsers=[])
    checks = targets(slow)
    assert [c.met for c in checks][4:] == [None, True, None]
    short = cache(
        [
            row(1, 400, 400, 400, Label.FIRST),
            row(2, 50, 51, 200),
            row(3, 90, 90, 700, Label.TEMPLATE_REWRITE),
        ]
    )
    text = render(results(caches=[short]))
    assert "Where a target falls short:" in text
    assert "even the ideal client (the tokens new to each request, 540 in all) is only 2.4x" in text
    assert "90 of the ideal's tokens are earlier turns read again" in text
    assert "grows with the square of the session's length" in text


def test_parser_ratio_is_loopd_median_over_the_reference() -> None:
    ratios = parser_ratios(results().parsers)
    assert ratios[("SSE", "as sent")] == 500_000 / 400_000
    assert ratios[("events", "as sent")] == 0.5


def test_an_offline_run_says_what_was_not_run() -> None:
    text = render(results(server=None, caches=[], switching=None, cpu=[], plot_files=[]))
    assert text.count("Not run (`--offline`).") == 4
    assert "not measured" in text


def test_replies_that_were_not_replayed_are_explained() -> None:
    plain = render(results())
    assert "Replies not replayed" not in plain
    cut = replace(row(2, 50, 51, 1500), reply=CUT_REPLY)
    text = render(results(caches=[cache([row(1, 400, 400, 400, Label.FIRST), cut])]))
    assert "The model's answers to requests #2 imitated the scripted calls" in text


def test_a_cpu_shortfall_is_projected_onto_the_production_models_speed() -> None:
    busy = CpuShare("model answers", spread(0.05), per_token_ms=spread(0.5))
    text = render(results(cpu=[busy]))
    assert "| model answers | 5 | 4.50 / 5.00 / 5.50 % | 0.45 / 0.50 / 0.55 |" in text
    assert "a median 0.50 ms of CPU" in text
    assert (
        "28 to 69 tokens/s (seed 000) that is at most 1.4% to 3.5% of its generation time" in text
    )
