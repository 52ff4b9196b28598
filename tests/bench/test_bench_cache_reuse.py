"""The cache benchmark's harnesses and its table, end to end against the fake llama-server."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from bench.cache_reuse import CUT_REPLY, SESSION, CacheResult, SessionSettings, run
from bench.ideal import Label
from bench.naive import Mistake
from bench.script import SCRIPT
from loopd.sessionlog import EntryKind, SessionLog
from loopd_dev.fakes.llama import ScriptedReply, ScriptedToolCall
from tests.bench.fake_server import fake_server

pytestmark = pytest.mark.anyio

SHORT = SCRIPT[:3]  # 6 requests: a recorded call, two scripted ones, three answers


async def _run(
    tmp_path: Path,
    *,
    drop_past_reasoning: bool = False,
    think_replies: Sequence[ScriptedReply] = (),
) -> CacheResult:
    async with fake_server(
        drop_past_reasoning=drop_past_reasoning, think_replies=think_replies
    ) as url:
        return await run(url, tmp_path, SessionSettings(), SHORT)


async def test_every_request_gets_a_row_with_the_servers_token_count(tmp_path: Path) -> None:
    result = await _run(tmp_path)
    assert [row.index for row in result.rows] == [1, 2, 3, 4, 5, 6]
    assert [row.reply for row in result.rows] == [
        "scripted",
        "model",
        "scripted",
        "scripted",
        "model",
        "model",
    ]
    assert all(row.counted_matches_server for row in result.rows)
    assert result.rows[0].label is Label.FIRST
    assert result.rows[0].ideal == result.rows[0].prompt_tokens


async def test_exact_replay_meets_the_ideal_and_the_naive_client_does_not(tmp_path: Path) -> None:
    result = await _run(tmp_path)
    judged = [row for row in result.rows if row.label is Label.NONE]
    assert judged, "no request was judged against the ideal"
    assert result.misses() == []
    assert all(0 <= row.over_ideal <= 2 for row in judged)
    assert result.naive_total > result.loopd_total
    assert all(row.naive_prompt_n > row.loopd_prompt_n for row in result.rows[1:])


async def test_each_mistake_of_the_naive_client_is_also_run_alone(tmp_path: Path) -> None:
    result = await _run(tmp_path)
    assert [alone.mistake for alone in result.mistakes_alone] == list(Mistake)
    by_mistake = {alone.mistake: alone.prompt_n_after_first for alone in result.mistakes_alone}
    # The time line changes every request near the prompt's start: each request is read whole.
    assert by_mistake[Mistake.TIME_IN_SYSTEM_LINE] > 2 * result.loopd_after_first
    assert result.naive_after_first > 2 * result.loopd_after_first


async def test_the_runs_of_one_mistake_can_be_left_out(tmp_path: Path) -> None:
    async with fake_server() as url:
        result = await run(url, tmp_path, SessionSettings(one_mistake_runs=False), SHORT)
    assert result.mistakes_alone == ()


async def test_a_template_that_drops_reasoning_is_labelled_not_counted_as_a_miss(
    tmp_path: Path,
) -> None:
    result = await _run(tmp_path, drop_past_reasoning=True)
    rewritten = [row for row in result.rows if row.label is Label.TEMPLATE_REWRITE]
    assert rewritten, "the rewritten reasoning went unnoticed"
    # Only a new user message makes the template drop earlier reasoning.
    assert all(row.after == "user message" for row in rewritten)
    assert result.misses() == []


async def test_loopd_replays_the_scripted_messages_byte_for_byte(tmp_path: Path) -> None:
    await _run(tmp_path)
    with SessionLog.open(tmp_path / "loopd.db") as log:
        messages = log.replay_messages(SESSION)
    for call in (call for turn in SHORT for call in turn.calls):
        assert call.message in messages
    roles = [json.loads(message)["role"] for message in messages]
    assert roles.count("assistant") == 6
    assert roles.count("tool") == 3


async def test_a_tool_call_cut_by_max_tokens_is_kept_but_never_replayed(tmp_path: Path) -> None:
    cut = ScriptedReply(
        reasoning="Maybe read it.",
        tool_calls=(ScriptedToolCall("read_file", '{"pa', id="cut"),),
        finish_reason="length",
    )
    # Request 1 is answered by a scripted message; request 2 is the model's own: the cut call.
    result = await _run(tmp_path, think_replies=[ScriptedReply(content="x"), cut])
    assert result.rows[1].reply == CUT_REPLY
    assert len(result.rows) == 6  # the session went on
    with SessionLog.open(tmp_path / "loopd.db") as log:
        entries = log.entries(SESSION)
        messages = log.replay_messages(SESSION)
    assert [entry.kind for entry in entries].count(EntryKind.BROKEN) == 1
    assert not any('"cut"' in message for message in messages)
    assert result.misses() == []  # the ideal did not count the discarded reply as cached
