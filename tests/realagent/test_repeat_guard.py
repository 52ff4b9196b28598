"""The repeat guard on the model that needs it: with loopd's own settings (the limit 2, 16 tool
rounds) the tool model's identical repeat is answered with a pointer, the next one ends the
turn with one line, noted in the log: three requests, not sixteen."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loopd.engine.guards import GuardLimits
from loopd.sessionlog.records import EntryKind
from loopd.tools.workspace import session_workspace
from loopd_dev import devserver
from tests.realagent.support import agent

# The tool model's rounds are bounded by tokens (and the repeat guard); on two cores shared with
# another test run a round can take a minute, so the safety net is wider than the suite's 300 s.
pytestmark = [pytest.mark.anyio, pytest.mark.real_server, pytest.mark.timeout(1200)]


async def test_the_guard_ends_the_models_repeating_turn_long_before_the_round_limit(
    tool_server: devserver.RunningServer, tmp_path: Path
) -> None:
    async with agent(
        tool_server, tmp_path / "st", repeat_limit=GuardLimits().repeat, max_rounds=None
    ) as a:
        (session_workspace(a.runtime.settings.workspaces, "g") / "notes.txt").write_text("x\n")
        outcome, calls = await a.turn("g", "Run the command `ls -a` with run_command.")
        results = [json.loads(a.result_of("g", call))["content"] for call in calls]
        entries = a.runtime.log.entries("g")
    line = outcome.failure or ""
    assert line.startswith("the model repeated a call ("), line
    assert line.endswith(", same arguments) 3 times; stopped")
    assert len(outcome.requests) < 16
    # The last three calls: run, pointed to its result, stopped (the calls are the same).
    first, pointed, stopped = calls[-3:]
    assert first.name == pointed.name == stopped.name
    assert f"(call {first.id})" in results[-2]
    assert f"Its result was:\n{results[-3]}\n" in results[-2]
    assert results[-1] == f"not run: {line}"
    assert entries[-1].kind is EntryKind.NOTE
    assert entries[-1].fields.text == line
