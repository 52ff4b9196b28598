"""The tool model's own calls to loopd's core tools, run in the session's workspace and read
back by the next request; the call streamed in deltas, stored and replayed byte for byte."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from loopd.tools.workspace import session_workspace
from loopd_dev import devserver
from tests.realagent.support import agent, tool_deltas

# The tool model's rounds are bounded by tokens (and the repeat guard); on two cores shared with
# another test run a round can take a minute, so the safety net is wider than the suite's 300 s.
pytestmark = [pytest.mark.anyio, pytest.mark.real_server, pytest.mark.timeout(1200)]


# Without an answer (this model never gives one after a tool result): the guard (limit 1 here)
# stops its first repeat, or the tier's round bound ends a turn whose calls all differ.
ENDED = re.compile(
    r"the model repeated a call \((\w+), same arguments\) 2 times; stopped"
    r"|stopped after 3 tool rounds without an answer"
)


async def test_a_list_dir_call_the_model_makes_runs_in_the_workspace_and_is_read_back(
    tool_server: devserver.RunningServer, tmp_path: Path
) -> None:
    async with agent(tool_server, tmp_path / "st") as a:
        workspace = session_workspace(a.runtime.settings.workspaces, "list")
        (workspace / "notes.txt").write_text("first notes\n")
        outcome, calls = await a.turn("list", 'List the files in the folder "." of the workspace.')
        call = calls[0]
        result = a.result_of("list", call)
        first, second = (r.perf for r in outcome.requests[:2])
        deltas = tool_deltas(bytes(a.client.streams[0]))
        assistant = a.messages("list")[2]
        bodies = a.client.bodies
    assert first.extra["finish_reason"] == "tool_calls"
    assert call.name == "list_dir"
    assert "notes.txt" in json.loads(result)["content"], result
    assert result.encode() in bodies[1], "the next request did not carry the result"
    # The call arrived in pieces (the first with its id and name); stored as joined.
    assert len(deltas) >= 2, deltas
    assert deltas[0].name == "list_dir"
    assert "".join(d.arguments for d in deltas) == call.arguments
    # Replayed byte for byte: the stored message is in the next body as stored, and the server
    # reuses everything the first request left in the slot.
    assert json.loads(assistant)["tool_calls"][0]["id"] == call.id
    assert assistant.encode() in bodies[1]
    assert first.cache_n is not None
    assert first.prompt_n is not None
    assert first.predicted_n is not None
    assert second.cache_n == first.cache_n + first.prompt_n + first.predicted_n - 1
    assert (second.cache_loss, second.cache_loss_cause) == (0, None)
    # After the listing it goes on (it may read notes.txt, or list again).
    assert ENDED.fullmatch(outcome.failure or ""), outcome.failure


async def test_a_run_command_call_the_model_makes_runs_inside_bubblewrap(
    tool_server: devserver.RunningServer, tmp_path: Path
) -> None:
    async with agent(tool_server, tmp_path / "st") as a:
        workspace = session_workspace(a.runtime.settings.workspaces, "cmd")
        (workspace / "notes.txt").write_text("first notes\n")
        outcome, calls = await a.turn("cmd", "Run the command `ls -a` with run_command.")
        call = calls[0]
        result = json.loads(a.result_of("cmd", call))["content"]
        sandbox = a.runtime.tools.sandbox
        body = a.client.bodies[1]
    assert call.name == "run_command"
    assert json.loads(call.arguments)["command"] == "ls -a"
    assert sandbox is not None
    assert sandbox.isolated, sandbox.reason
    assert result.startswith("exit code 0"), result
    assert "notes.txt" in result.splitlines()
    assert json.dumps(result)[1:-1].encode() in body
    assert ENDED.fullmatch(outcome.failure or ""), outcome.failure
