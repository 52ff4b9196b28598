"""The scripted 30-request session of the cache benchmark. Pure data.

Ten user turns on the thinking preset. In each, the assistant first makes 0 to 4 rounds of tool
calls, then answers. The tiny model cannot make tool calls on its own (its template has a format
for them, but it never writes one unprompted), so every tool-calling assistant message is
scripted: one is the real tool call recorded from this server in
``tests/data/streams/tool_call.sse``, the others are written in the same shape, with reasoning as
a thinking model gives it. The tool results are scripted too. The final answer of each turn is
the model's own (its thinking included), replayed exactly as streamed, unless ``max_tokens`` cut
it off inside a tool call it made on its own (``cache_reuse`` says why that one is not replayed).

A scripted message is stored exactly as loopd stores a streamed one (``AssistantMessage.to_wire``
serialized with ``loopcommon.jsonbytes.dumps``), arguments in the compact form the server streams.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass

from loopcommon.jsonbytes import dumps
from loopd.wire import AssistantMessage, ToolCall

SYSTEM_TEXT = "You are loopd's benchmark agent in a team chat. Use the tools, then answer briefly."

TOOLS: list[dict[str, object]] = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a text file in the workspace.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "run_command",
            "description": "Run a shell command in the workspace and return its output.",
            "parameters": {
                "type": "object",
                "properties": {
                    "command": {"type": "string"},
                    "timeout_s": {"type": "integer", "minimum": 1},
                },
                "required": ["command"],
            },
        },
    },
]

# Assembled from tests/data/streams/tool_call.sse (a real tool call by this server and model);
# tests/bench checks that the two agree byte for byte.
RECORDED_TOOL_CALL = (
    '{"role":"assistant","content":null,"tool_calls":[{"id":"rbhc7SftedQt8SqJfmYKWD9zbeiDM1uM",'
    '"type":"function","function":{"name":"read_file","arguments":"{\\"path\\":\\"notes.txt\\"}"}}]}'
)


@dataclass(frozen=True)
class ScriptedCall:
    """A scripted assistant message that calls tools, and the result of each call in order."""

    message: str
    results: tuple[str, ...]
    recorded: bool = False

    @property
    def call_ids(self) -> tuple[str, ...]:
        calls = json.loads(self.message)["tool_calls"]
        return tuple(str(call["id"]) for call in calls)


@dataclass(frozen=True)
class UserTurn:
    """A user message, the scripted tool rounds that follow it, then the model's own answer."""

    text: str
    calls: tuple[ScriptedCall, ...] = ()

    @property
    def requests(self) -> int:
        return len(self.calls) + 1


def call_id(turn: int, index: int) -> str:
    """A stable id in the server's shape (32 alphanumeric characters)."""
    return hashlib.sha256(f"bench-{turn}-{index}".encode()).hexdigest()[:32]


def scripted(
    turn: int, index: int, reasoning: str, calls: Sequence[tuple[str, str]], *results: str
) -> ScriptedCall:
    """A tool-calling message; ``calls`` are (name, arguments text) pairs."""
    if len(calls) != len(results):
        raise ValueError("every scripted tool call needs exactly one result")
    tool_calls = tuple(
        ToolCall(call_id(turn, index * 10 + n), name, arguments)
        for n, (name, arguments) in enumerate(calls)
    )
    message = AssistantMessage(content="", reasoning_content=reasoning, tool_calls=tool_calls)
    return ScriptedCall(dumps(message.to_wire()), tuple(results))


def _read(path: str) -> tuple[str, str]:
    return ("read_file", dumps({"path": path}))


def _run(command: str, timeout_s: int | None = None) -> tuple[str, str]:
    args: dict[str, object] = {"command": command}
    if timeout_s is not None:
        args["timeout_s"] = timeout_s
    return ("run_command", dumps(args))


SCRIPT: tuple[UserTurn, ...] = (
    UserTurn(
        "What is in notes.txt?",
        (
            ScriptedCall(
                RECORDED_TOOL_CALL,
                ("- ship the parser fix\n- ask Dana about the release date\n- rerun the bench",),
                recorded=True,
            ),
        ),
    ),
    UserTurn(
        "Does the test suite pass?",
        (
            scripted(2, 0, "Run the suite first.", [_run("pytest -q", 120)], "3 failed, 41 passed"),
            scripted(
                2,
                1,
                "The failures are in the parser tests; read them.",
                [_read("tests/test_parser.py")],
                "def test_split():\n    assert split('a,b') == ['a', 'b']",
            ),
        ),
    ),
    UserTurn("Thanks. Which of those failures matters most?"),
    UserTurn(
        "Fix the parser bug and show me the diff.",
        (
            scripted(4, 0, "Read the parser.", [_read("src/parser.py")], "def split(s):\n    ..."),
            scripted(
                4, 1, "Find every split call.", [_run("grep -n split src")], "src/parser.py:1"
            ),
            scripted(
                4,
                2,
                "Apply the fix with sed.",
                [_run("sed -i 's/maxsplit=1/maxsplit=-1/' src/parser.py")],
                "",
            ),
        ),
    ),
    UserTurn(
        "Run the tests again.",
        (scripted(5, 0, "Rerun.", [_run("pytest -q", 120)], "44 passed in 2.31s"),),
    ),
    UserTurn(
        "What changed in the last commit?",
        (
            scripted(6, 0, "Look at the log.", [_run("git log -1 --stat")], "parser.py | 2 +-"),
            scripted(6, 1, "And the diff itself.", [_run("git diff HEAD~1")], "-1 +-1 maxsplit"),
        ),
    ),
    UserTurn("Summarise the notes for Dana in two lines."),
    UserTurn(
        "Check the release checklist and the changelog.",
        (
            scripted(8, 0, "The checklist first.", [_read("docs/release.md")], "1. tag\n2. notes"),
            scripted(
                8,
                1,
                "Both at once: the changelog and the tags.",
                [_read("CHANGELOG.md"), _run("git tag --list")],
                "## 0.4.0\n- parser fix",
                "v0.3.0\nv0.3.1",
            ),
            scripted(8, 2, "Which version is set?", [_read("pyproject.toml")], 'version = "0.4.0"'),
            scripted(8, 3, "Anything uncommitted?", [_run("git status --short")], " M notes.txt"),
        ),
    ),
    UserTurn(
        "Is the benchmark still slow?",
        (
            scripted(9, 0, "Run it.", [_run("make bench", 600)], "bench: 28 s"),
            scripted(9, 1, "Compare with the report.", [_read("bench/latest.md")], "was 95 s"),
            scripted(9, 2, "Is the machine busy?", [_run("uptime")], "load average: 0.31"),
        ),
    ),
    UserTurn(
        "Write a short status for the thread.",
        (
            scripted(10, 0, "Reread the notes.", [_read("notes.txt")], "- ship the parser fix"),
            scripted(10, 1, "Recent commits.", [_run("git log --oneline -3")], "a1b2c3 fix split"),
            scripted(10, 2, "Tests once more.", [_run("pytest -q", 120)], "44 passed"),
            scripted(10, 3, "And the checklist.", [_read("docs/release.md")], "1. tag\n2. notes"),
        ),
    ),
)


def request_count(script: Sequence[UserTurn] = SCRIPT) -> int:
    return sum(turn.requests for turn in script)
