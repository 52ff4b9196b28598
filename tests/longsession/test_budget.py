"""The budget's pure rules: when to compact, how big one input may be, how it is cut."""

from __future__ import annotations

import pytest

from loopd.contextwindow.budget import (
    MESSAGE_OVERHEAD,
    MIN_INPUT_CAP,
    BudgetRules,
    BudgetVerdict,
    cut_note,
    cut_text,
    estimate_prompt,
    fit_input,
    input_cap,
    judge,
    upper_bound_tokens,
)

RULES = BudgetRules(compact_at=0.75, max_tokens=30, summary_max_tokens=256, margin=64)


def test_under_the_threshold_a_turn_fits() -> None:
    assert judge(3071, 4096, RULES, turn_start=True, exact=True) is BudgetVerdict.FITS


def test_at_the_threshold_a_turn_compacts_once_the_count_is_exact() -> None:
    assert judge(3072, 4096, RULES, turn_start=True, exact=False) is BudgetVerdict.COUNT_EXACTLY
    assert judge(3072, 4096, RULES, turn_start=True, exact=True) is BudgetVerdict.COMPACT


def test_within_a_turn_only_the_hard_limit_compacts() -> None:
    # Past the threshold but the prompt and a full answer still fit: the turn goes on.
    assert judge(3500, 4096, RULES, turn_start=False, exact=True) is BudgetVerdict.FITS
    # 4096 - 30 (answer) - 64 (margin) = 4002 is the last size that fits.
    assert judge(4002, 4096, RULES, turn_start=False, exact=True) is BudgetVerdict.FITS
    assert judge(4003, 4096, RULES, turn_start=False, exact=True) is BudgetVerdict.COMPACT


def test_an_answer_never_takes_more_than_the_context_above_the_threshold() -> None:
    # The shipped max_tokens (12288) on a 4,096-token dev slot: the answer may take the 1,024
    # tokens above the threshold, so a tool round at 3,000 tokens does not compact.
    small_slot = BudgetRules(compact_at=0.75, max_tokens=12288, margin=64)
    assert small_slot.answer_room(4096) == 1024
    assert judge(3000, 4096, small_slot, turn_start=False, exact=True) is BudgetVerdict.FITS
    assert judge(3009, 4096, small_slot, turn_start=False, exact=True) is BudgetVerdict.COMPACT
    # On production's 262,144-token slot max_tokens is the smaller bound.
    assert small_slot.answer_room(262144) == 12288


def test_the_estimate_adds_an_upper_bound_for_each_appended_message() -> None:
    assert estimate_prompt(None, ["hi"]) is None
    assert estimate_prompt(1000, []) == 1000
    assert estimate_prompt(1000, ["héllo", "x"]) == 1000 + 6 + 1 + 2 * MESSAGE_OVERHEAD


def test_the_upper_bound_is_never_below_the_byte_count() -> None:
    text = "1234567890" * 10  # digits: about one token each on small vocabularies
    assert upper_bound_tokens(text) >= len(text.encode())


def test_input_cap_leaves_room_for_a_compaction_request() -> None:
    cap = input_cap(4096, RULES, instruction_tokens=100)
    assert cap == 4096 - 3072 - 30 - 100 - 256 - 64
    # A turn just under the threshold, the previous answer, this input, the instruction and the
    # summary still fit in the context.
    assert 3071 + 30 + cap + 100 + 256 <= 4096


def test_input_cap_has_a_floor() -> None:
    rules = BudgetRules(max_tokens=4096)
    assert input_cap(4096, rules, instruction_tokens=100) == MIN_INPUT_CAP


def test_production_context_allows_large_inputs() -> None:
    cap = input_cap(262144, BudgetRules(max_tokens=4096, summary_max_tokens=512), 100)
    assert 60000 < cap < 65536


def test_cut_text_keeps_the_head_and_says_what_was_left_out() -> None:
    text = "a" * 100
    cut = cut_text(text, 40, original_tokens=5000, cap=600, what="this message")
    assert cut.startswith("a" * 40)
    assert not cut.startswith("a" * 41)
    assert cut.endswith(cut_note(5000, 600, 60, "this message"))
    assert "5,000 tokens" in cut
    assert "600" in cut
    assert "60 characters" in cut


async def _count_words(text: str) -> int:
    return len(text.split())


@pytest.mark.anyio
async def test_fit_input_leaves_a_short_text_alone() -> None:
    fitted = await fit_input("a few words", 10, _count_words)
    assert fitted.text == "a few words"
    assert not fitted.was_cut
    assert fitted.original_tokens == 3


@pytest.mark.anyio
async def test_fit_input_cuts_until_the_counted_text_fits() -> None:
    text = " ".join(f"w{i}" for i in range(10_000))
    fitted = await fit_input(text, 200, _count_words, "this tool result")
    assert fitted.was_cut
    assert fitted.original_tokens == 10_000
    assert await _count_words(fitted.text) <= 200
    assert fitted.text.startswith("w0 w1 w2")
    assert "[loopd: this tool result was cut here. It was 10,000 tokens" in fitted.text


@pytest.mark.anyio
async def test_fit_input_gives_up_keeping_text_rather_than_loop() -> None:
    async def note_alone_too_long(text: str) -> int:
        return 10**6

    fitted = await fit_input("x" * 50, 10, note_alone_too_long)
    assert fitted.was_cut
    assert not fitted.text.startswith("x")
