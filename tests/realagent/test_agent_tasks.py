"""Small tasks the agent model (``qwen-coder-agent``) finishes through loopd: a one-step task
(read a file, answer with a value from it) and a two-step task (list a folder, read the file
found there, answer), each answered in words with the value the file holds, and no loop guard
or repetition watch firing on the way.

Each turn is bounded by tokens: ``max_tokens`` 150 a request, at most ``ROUNDS`` requests (the
tier's bound on rounds), loopd's default guards. At temperature 0 a turn repeats on the same
build: the prompts are ones the model finishes there (``python -m bench --agent`` measures a
dozen).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from loopd.engine.guards import GuardLimits
from loopd.engine.outcome import TurnOutcome
from loopd.observe.metrics import METRICS
from loopd.tools.workspace import session_workspace
from loopd.wire.assemble import ToolCall
from loopd_dev import devserver
from tests.realagent.support import agent

# The agent model reads a prompt at about 14 tokens a second on two loaded cores; the first
# request of the tier reads the whole system text and tools (about 960 tokens).
pytestmark = [pytest.mark.anyio, pytest.mark.real_server, pytest.mark.timeout(1200)]

ROUNDS = 4


def firings() -> float:
    """Every loop guard's and the repetition watch's firings so far, in this process."""
    return sum(
        sample.value
        for metric in METRICS.registry.collect()
        if metric.name == "loopd_guard_firings"
        for sample in metric.samples
        if sample.name.endswith("_total")
    )


@dataclass
class Task:
    """One turn of the agent on a workspace holding ``files``: its outcome, the calls it made and
    the text of each call's result."""

    outcome: TurnOutcome
    calls: list[ToolCall]
    results: list[str]


async def task(
    server: devserver.RunningServer, state: Path, files: dict[str, str], prompt: str
) -> Task:
    """The turn, with loopd's default guards; no guard or repetition watch may fire in it."""
    before = firings()
    async with agent(
        server,
        state,
        model=devserver.AGENT_MODEL,
        repeat_limit=GuardLimits().repeat,
        max_rounds=ROUNDS,
    ) as a:
        workspace = session_workspace(a.runtime.settings.workspaces, "task")
        for name, text in files.items():
            (workspace / name).parent.mkdir(parents=True, exist_ok=True)
            (workspace / name).write_text(text)
        outcome, calls = await a.turn("task", prompt)
        results = [json.loads(a.result_of("task", call))["content"] for call in calls]
    print(f"answer: {outcome.answer!r}; {len(outcome.requests)} requests; calls {calls}")
    assert outcome.failure is None, outcome.failure
    assert (outcome.guard, outcome.notices) == (None, [])
    assert firings() == before
    return Task(outcome, calls, results)


async def test_a_one_step_task_is_answered_with_the_value_the_file_holds(
    agent_server: devserver.RunningServer, tmp_path: Path
) -> None:
    done = await task(
        agent_server,
        tmp_path,
        {"garden.txt": "The garden has one flower: a yellow tulip by the gate.\n"},
        "Read garden.txt and name the flower it mentions.",
    )
    assert "tulip" in (done.outcome.answer or "").lower()
    # It reads the file (at temperature 0 on build 11434 it first lists the path, then reads it).
    last = done.calls[-1]
    assert (last.name, json.loads(last.arguments)["path"]) == ("read_file", "garden.txt")


async def test_a_two_step_task_lists_then_reads_the_file_found_then_answers(
    agent_server: devserver.RunningServer, tmp_path: Path
) -> None:
    done = await task(
        agent_server,
        tmp_path,
        {"reports/march.txt": "Report for March\ntotal: 1250\n"},
        "Look in the folder reports and tell me the total it records.",
    )
    assert "1250" in (done.outcome.answer or "")
    assert [c.name for c in done.calls] == ["list_dir", "read_file"]
    assert "march.txt" in done.results[0]
    assert json.loads(done.calls[1].arguments)["path"] == "reports/march.txt"
