"""search_files' regexes: linear time (RE2), a clear error for what RE2 refuses, a time bound."""

import itertools
import json
import time
from pathlib import Path

import anyio
import pytest

from loopd.tools import ToolContext, ToolFailure, ToolLimits, run_core_tool
from loopd.tools.files import search_files
from loopd.tools.workspace import Workspace

CATASTROPHIC = "^(a+)+$"

pytestmark = pytest.mark.anyio


async def test_a_catastrophic_pattern_does_not_freeze_the_event_loop(
    ctx: ToolContext, workspace: Path
) -> None:
    """``^(a+)+$`` on 27 a's and a '!' backtracks for seconds in Python's ``re``, holding the GIL:
    the event loop (every session's stream, the Mattermost socket) would stall all that time."""
    (workspace / "evil.txt").write_text("a" * 27 + "!\n")
    ticks: list[float] = []
    ticking = anyio.Event()

    async def tick() -> None:
        while True:
            ticks.append(time.monotonic())
            ticking.set()
            await anyio.sleep(0.01)

    async with anyio.create_task_group() as tg:
        tg.start_soon(tick)
        await ticking.wait()  # the stall is measured from a tick before the search
        arguments = json.dumps({"pattern": CATASTROPHIC, "regex": True})
        result = await run_core_tool("search_files", arguments, ctx)
        ticks.append(time.monotonic())
        tg.cancel_scope.cancel()
    assert result.ok
    assert result.text == f"no matches for {CATASTROPHIC!r} under ."
    longest_stall = max(later - earlier for earlier, later in itertools.pairwise(ticks))
    assert longest_stall < 1.0


async def test_regex_syntax_still_matches(ctx: ToolContext, workspace: Path) -> None:
    (workspace / "a.py").write_text("x = 10\ndef f(): pass\n  return 42\n")
    arguments = json.dumps({"pattern": r"(?P<kw>def|return)\s+\w+", "regex": True})
    result = await run_core_tool("search_files", arguments, ctx)
    assert result.text.splitlines() == ["a.py:2: def f(): pass", "a.py:3:   return 42"]


@pytest.mark.parametrize(
    ("pattern", "why"),
    [
        pytest.param(
            r"(a)\1",
            r"invalid escape sequence: \1 (backreferences are not supported)",
            id="backreference",
        ),
        pytest.param(
            "foo(?=bar)", "invalid perl operator: (?= (lookahead is not supported)", id="lookahead"
        ),
        pytest.param(
            "(?<!x)y", "invalid perl operator: (?<! (lookbehind is not supported)", id="lookbehind"
        ),
        pytest.param("[a-", "missing ]: [a-", id="unbalanced"),
    ],
)
async def test_a_pattern_re2_cannot_compile_is_one_clear_error(
    ctx: ToolContext, workspace: Path, pattern: str, why: str
) -> None:
    (workspace / "a.txt").write_text("foobar\n")
    arguments = json.dumps({"pattern": pattern, "regex": True})
    result = await run_core_tool("search_files", arguments, ctx)
    assert not result.ok
    assert result.text.startswith(f"search_files: the regex {pattern!r} cannot be used: {why}. ")
    assert "RE2 syntax" in result.text
    assert "\n" not in result.text


class StepClock:
    """A clock that moves one second each time it is read: time spent, without waiting."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def test_a_search_past_its_time_limit_stops_with_what_it_found(workspace: Path) -> None:
    for index in range(20):
        (workspace / f"f{index:02}.txt").write_text("needle\nhay\n" * 5)
    limits = ToolLimits(search_max_seconds=4)
    with pytest.raises(ToolFailure) as caught:
        search_files(Workspace.at(workspace), "needle", ".", False, limits, clock=StepClock())
    lines = str(caught.value).splitlines()
    assert lines[0] == (
        "search_files: stopped after 4 s, in f00.txt (1 file reached); narrow the path or the "
        "pattern. The matches so far:"
    )
    assert lines[1:] == ["f00.txt:1: needle", "f00.txt:3: needle"]


def test_a_search_past_its_time_limit_with_no_match_says_so(workspace: Path) -> None:
    (workspace / "a.txt").write_text("hay\n" * 10)
    with pytest.raises(ToolFailure, match=r"stopped after 2 s, .*\. No match so far\.$"):
        search_files(
            Workspace.at(workspace), "x", ".", True, ToolLimits(search_max_seconds=2), StepClock()
        )
