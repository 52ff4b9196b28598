"""The repetition watch: what counts as a loop in a stream of tokens; then on the fake server, a
looping thought ended by the control call before the cap, a looping answer closed and kept as
written, and ordinary text left alone."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from loopd.engine.loops import RepetitionWatch
from loopd.engine.outcome import Loop
from loopd.engine.stream import run_request
from loopd.engine.thinkcap import SUCCESS, Continue, ControlCall, SendControl, ThinkCap
from loopd.observe.metrics import METRICS
from loopd.sessionlog.records import EntryKind
from loopd_dev.fakes.llama import FakeLlama, Pace, ScriptedReply
from tests.engine.engine_support import (
    FAST,
    SESSION,
    SLOT,
    eventually,
    make_turn,
    open_log,
    records,
    say,
    served,
    user_body,
)

DOCS = Path(__file__).resolve().parents[2] / "docs"
PROSE = (DOCS / "design.md").read_text()
# A reply of ordinary prose, 100 words, none of them in a loop.
ANSWER = " ".join(PROSE.split()[:100])


# Pieces as a byte-pair tokenizer cuts text: a word with the space before it, a run of one mark,
# a run of spaces.
PIECE = re.compile(r" ?[^\W_]{1,8}| ?([^\w\s])\1{0,7}|\s+|_")


def watched(text: str, window: int = 64) -> RepetitionWatch:
    watch = RepetitionWatch(window)
    for piece in PIECE.finditer(text):
        watch.feed(piece.group())
    return watch


def test_marks_in_a_loop_a_sentence_again_and_again_and_a_tag_again_loop() -> None:
    assert watched("?!" * 40).looping
    assert watched("Let me check the file again. " * 30).looping
    # Seen on the tiny thinking preset: 8 tokens a round.
    assert watched("<tort_think_tort_tort>\n" * 40).looping
    # A longer loop needs a longer window: 18 tokens a round, more than a third of 48.
    long_round = "I will read the notes, then the list, then the notes again to be sure. "
    assert not watched(long_round * 10, window=48).looping
    assert watched(long_round * 10, window=128).looping


def test_prose_code_and_tables_do_not_loop() -> None:
    assert not watched(PROSE, window=256).looping
    code = (Path(__file__).resolve().parents[2] / "loopd" / "engine" / "stream.py").read_text()
    assert not watched(code, window=256).looping
    table = (DOCS / "observability.md").read_text()  # tables, rules of dashes
    assert not watched(table, window=256).looping


def test_a_window_not_yet_full_or_zero_never_loops() -> None:
    assert not watched("?!" * 31).looping  # 62 tokens of a 64-token window
    assert watched("?!" * 32).looping
    assert not watched("?!" * 400, window=0).looping
    empty = RepetitionWatch(4)
    for _ in range(10):
        empty.feed("")
    assert (empty.tokens, empty.looping) == (0, False)


def test_a_looping_thought_is_ended_by_the_control_call_before_the_cap() -> None:
    cap = ThinkCap(cap=1000, grace=50)
    armed = ControlCall(SUCCESS, answered_at=300)
    assert cap.decide(300, answering=False, control=None, looping=True) == SendControl()
    assert cap.decide(300, answering=False, control=armed, looping=True) == Continue()
    assert cap.decide(300, answering=True, control=None, looping=True) == Continue()


LOOPING_THOUGHT = ScriptedReply(
    reasoning="I need to check the file again. " * 200, content="The answer."
)
LOOPING_ANSWER = ScriptedReply(content="Sure, I will check. " * 200)


def fired(guard: str, action: str) -> float:
    labels = {"guard": guard, "action": action}
    return METRICS.registry.get_sample_value("loopd_guard_firings_total", labels) or 0.0


@pytest.mark.anyio
async def test_a_looping_thought_is_ended_and_the_model_answers() -> None:
    fake = FakeLlama(pace=Pace(tokens_per_second=2000))
    fake.push(LOOPING_THOUGHT)
    limits = replace(FAST, think_cap=100_000, loop_window=64)
    async with served(fake) as server:
        result = await run_request(server.client, user_body("x"), slot=SLOT, limits=limits)
    assert result.complete, result.detail
    assert (result.looped, result.capped, result.control_answer) == (
        [Loop.REASONING],
        True,
        "success",
    )
    assert result.assembler.content == "The answer."
    # 64 tokens of the watch are about 10 rounds of the sentence: ended long before its 200.
    assert result.assembler.reasoning.count("I need to check") < 40
    [note] = result.notes
    # The count when the control call went: the server may write a token or two more first.
    ended_at = re.fullmatch(
        r"the model's thinking went round in circles; loopd ended it after (\d+) tokens", note
    )
    assert ended_at is not None, note
    assert 64 <= int(ended_at[1]) <= result.assembler.thinking_tokens


@pytest.mark.anyio
async def test_without_the_watch_the_same_thought_runs_to_max_tokens() -> None:
    fake = FakeLlama(pace=Pace(tokens_per_second=2000))
    fake.push(LOOPING_THOUGHT)
    limits = replace(FAST, think_cap=100_000, loop_window=0)
    async with served(fake) as server:
        result = await run_request(server.client, user_body("x"), slot=SLOT, limits=limits)
    assert result.complete
    assert (result.looped, result.capped) == ([], False)
    assert result.assembler.finish_reason == "length"  # 512 tokens of it
    assert result.assembler.reasoning.count("I need to check") > 40


@pytest.mark.anyio
async def test_a_looping_answer_is_closed_and_kept_as_written(tmp_path: Path) -> None:
    before = fired("answer_loop", "closed")
    fake = FakeLlama(pace=Pace(tokens_per_second=2000))
    fake.push(LOOPING_ANSWER, ScriptedReply(content="Fine."))
    async with served(fake) as server:
        log = open_log(tmp_path)
        say(log, "check it")
        turn = make_turn(server, log, limits=replace(FAST, loop_window=64))
        looped = await turn.run()
        await eventually(lambda: not fake.model().slots.slots[SLOT].is_processing)
        say(log, "and now?")
        after = await make_turn(server, log).run()
        closed = fake.chat_records()[0].outcome
    kept = looped.answer or ""
    assert looped.failure is None
    assert kept.startswith("Sure, I will check. Sure, I will check.")
    assert kept.count("Sure") < 40
    first, _ = records(log)
    assert looped.notices == [
        "the answer went round in circles; loopd closed it after "
        f"{first.record.perf.predicted_n} tokens and kept it as written"
    ]
    assert closed == "disconnected"
    assert fired("answer_loop", "closed") == before + 1
    perf = first.record.perf
    assert (perf.outcome, perf.extra["looped"]) == ("complete", ["answer"])
    # The answer is in the log as written, and replayed as such by the next request.
    assistant = next(e for e in log.entries(SESSION) if e.kind is EntryKind.ASSISTANT)
    assert json.loads(assistant.message or "")["content"] == kept
    assert after.answer == "Fine."


@pytest.mark.anyio
async def test_an_ordinary_answer_and_thought_are_left_alone(tmp_path: Path) -> None:
    fake = FakeLlama(pace=Pace(tokens_per_second=2000))
    fake.push(ScriptedReply(reasoning=ANSWER, content=ANSWER))
    async with served(fake) as server:
        log = open_log(tmp_path)
        say(log, "explain")
        outcome = await make_turn(server, log, limits=replace(FAST, loop_window=64)).run()
    assert (outcome.answer, outcome.notices) == (ANSWER, [])
    assert "looped" not in records(log)[0].record.perf.extra
