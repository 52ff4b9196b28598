"""The durable section: chosen alone by its flag, the state's two parts fitted from two lengths,
and its tables from the measured figures."""

from bench.cli import parse_args
from bench.durable import Durable, Return, Saved, render, state_sizes
from bench.durable_cap import CapRun
from bench.durable_cap import render as render_cap
from bench.durable_loopd import LoopdReturn
from bench.durable_loopd import render as render_loopd
from bench.durable_rule import LongReturn, RuleRun, WarmTurns
from bench.durable_rule import render as render_rule
from bench.durable_turns import TurnsReturn
from bench.durable_turns import render as render_turns


def saved(preset: str, slot: int, n_saved: int, n_written: int) -> Saved:
    return Saved(preset, f"{preset}-{slot}", slot, "f.bin", n_saved, 31, n_saved, n_written, 1.0)


def test_the_durable_flag_chooses_the_section_alone() -> None:
    assert not parse_args([]).durable
    args = parse_args(["--durable"])
    assert args.durable
    assert args.command == "python -m bench --durable"


def test_the_fixed_and_the_per_token_parts_of_a_state() -> None:
    # 1,000 fixed bytes (a recurrent state) and 50 a token.
    saves = [saved("hybrid", 0, 100, 6_000), saved("hybrid", 1, 300, 16_000)]
    assert state_sizes(saves) == {"hybrid": (1_000.0, 50.0)}


def test_the_tables_show_each_return_and_each_state() -> None:
    saves = [saved("smollm2", 0, 352, 8_116_488), saved("smollm2", 1, 788, 18_168_904)]
    cold = Return("smollm2", "restart", "smollm2-0", False, 383, 0, 31, 8.1)
    warm = Return("smollm2", "restart", "smollm2-0", True, 31, 352, 31, 0.2, 0.0087, 352)
    text = render(Durable(saves, [cold, warm], state_sizes(saves)))
    row = "| smollm2 | restart | 352 tokens |"
    assert f"{row} no | 0 | 383 | 31 | 12.35 | 8100 ms | 0.0 ms |" in text
    assert f"{row} yes | 352 | 31 | 31 | 1.00 | 200 ms | 8.7 ms |" in text
    assert "| smollm2 | 352 | 8,116,488 | 23,058 | 1.0 |" in text


def test_the_loopd_table_shows_the_ratio_and_the_cause() -> None:
    rows = [
        LoopdReturn("qwen35moe", "reload", False, "alpha", 0, 560, 40, "server restarted", 1),
        LoopdReturn("qwen35moe", "reload", True, "alpha", 520, 40, 40, "restored from disk", 2),
    ]
    text = render_loopd(rows)
    row = "| qwen35moe | reload |"
    assert f"{row} off | alpha | 0 | 560 | 40 | 14.00 | server restarted | 1 |" in text
    assert f"{row} on | alpha | 520 | 40 | 40 | 1.00 | restored from disk | 2 |" in text


def test_the_many_threads_table_sums_the_share_re_read() -> None:
    rows = [
        TurnsReturn(False, 2_000, 500, 1_540, "not in the host cache", 900.0),
        TurnsReturn(False, 2_000, 2_000, 40, "", 300.0),
        TurnsReturn(True, 2_000, 2_000, 40, "restored from disk", 400.0),
        TurnsReturn(True, 2_000, 2_000, 40, "restored from disk", 200.0),
    ]
    text = render_turns(rows)
    assert "take turns (3 turns each)" in text
    causes = "none 1, not in the host cache 1"
    assert f"| off | 2 | 4,000 | 1,500 | 37.5% | 1,580 | 600 | {causes} |" in text
    assert "| on | 2 | 4,000 | 0 | 0.0% | 80 | 300 | restored from disk 2 |" in text


def test_the_cap_table_shows_disk_against_the_cap() -> None:
    mib = 1024 * 1024
    run = CapRun(21 * mib, 5 * mib, 12, 25 * mib, 20 * mib, 4, 4, 8)
    assert "| 21.0 MiB | 25.0 MiB | 20.0 MiB | 4 | 4 | 8 |" in render_cap(run)


def test_the_save_rule_tables_compare_skipped_turns_and_show_each_return() -> None:
    warm = WarmTurns("qwen35moe", [100.0, 104.0, 102.0], [99.0, 101.0, 100.0], 2, "a reason")
    long_on = LongReturn("smollm2", True, 3210, "save", "its reason", 350.0, 25, 12.5)
    long_off = LongReturn("smollm2", False, 3210, "-", "", 2900.0, 3210, 0.0)
    text = render_rule(RuleRun([warm], [long_on, long_off]))
    assert "| qwen35moe | 3 | 2 | 102.0 ms | 100.0 ms | 1.020 | a reason |" in text
    assert "| smollm2 | on | 3210 | save | 350 ms | 12.5 ms | 25 |" in text
    assert "| smollm2 | off | 3210 | - | 2900 ms | 0.0 ms | 3210 |" in text
    assert "- smollm2: its reason" in text
