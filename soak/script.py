"""Tool rounds scripted through the users' messages.

The tiny model never calls a tool by itself, so a simulated user asks for tool calls in words the
inference relay (``soak.relay``) understands: ``[soak-tool TAG xN wW]`` in a message means "call
``mark_ticket`` N times, tags ``TAG-1`` to ``TAG-N``, each waiting W seconds". While the request's
current turn (the messages after the last answer) holds such a message whose calls have not been
made, the relay answers in the model's place: first ``find_tool`` (brokerd lets a session call only
what it was shown), then all N ``call_tool`` calls in one assistant message. Every other request,
the one carrying the tools' results included, goes to the real server.

What the relay answers is derived from the request alone, as a model's answer is from its prompt:
a turn that lost its tool rounds (a crash before they were stored) is scripted again, with new call
ids, exactly as a model would call again. Only a tool run twice for one stored call is loopd's
fault, and the marks file (one line per run, tagged) shows it.

This hook exists only here: nothing in loopd or brokerd knows of it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

MARK_TOOL = "mark_ticket"
FIND_QUERY = "mark a ticket as done"
_DIRECTIVE = re.compile(r"\[soak-tool (?P<tag>[a-z0-9]{1,20}) x(?P<count>\d{1,2}) w(?P<wait>\d)\]")
# loopd's own user messages (the compaction instruction, an epoch's summary) begin so; never
# scripted.
_LOOPD_INSTRUCTION = "[loopd]"


@dataclass(frozen=True)
class Directive:
    tag: str
    count: int
    wait_s: int

    def text(self) -> str:
        return f"[soak-tool {self.tag} x{self.count} w{self.wait_s}]"

    def call_tags(self) -> list[str]:
        return [f"{self.tag}-{i}" for i in range(1, self.count + 1)]


@dataclass(frozen=True)
class ScriptedCall:
    """One tool call the relay makes in the model's place: the function and its argument text."""

    name: str
    arguments: str


def directives_in(text: str) -> list[Directive]:
    return [Directive(m["tag"], int(m["count"]), int(m["wait"])) for m in _DIRECTIVE.finditer(text)]


def _current_turn(messages: list[Any]) -> list[Any]:
    """The messages after the last assistant answer (an assistant message without tool calls)."""
    start = 0
    for index, message in enumerate(messages):
        answer = isinstance(message, dict) and message.get("role") == "assistant"
        if answer and not message.get("tool_calls"):
            start = index + 1
    return messages[start:]


def _calls_made(turn: list[Any]) -> list[tuple[str, dict[str, Any]]]:
    """(function name, parsed arguments) of every tool call the turn's assistant messages made."""
    made = []
    for message in turn:
        if not isinstance(message, dict) or message.get("role") != "assistant":
            continue
        for call in message.get("tool_calls") or []:
            function = call.get("function", {}) if isinstance(call, dict) else {}
            try:
                arguments = json.loads(function.get("arguments") or "{}")
            except ValueError:
                arguments = {}
            if isinstance(arguments, dict):
                made.append((str(function.get("name", "")), arguments))
    return made


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def next_round(body: Any) -> list[ScriptedCall] | None:
    """The tool calls to answer ``body`` (a chat completion request) with, or None to send it to
    the real server."""
    if not isinstance(body, dict) or not _offers(body, "call_tool"):
        return None
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return None
    last = messages[-1]
    if isinstance(last, dict) and _text(last).startswith(_LOOPD_INSTRUCTION):
        return None
    turn = _current_turn(messages)
    made = _calls_made(turn)
    found = {str(args.get("query", "")) for name, args in made if name == "find_tool"}
    called = {
        str(inner.get("tag", ""))
        for name, args in made
        if name == "call_tool" and isinstance(inner := args.get("arguments"), dict)
    }
    for message in turn:
        if not isinstance(message, dict) or message.get("role") != "user":
            continue
        if _text(message).startswith(_LOOPD_INSTRUCTION):
            # loopd's summary of a compacted epoch quotes earlier messages: history, not a
            # request (what it asked for was done, or is carried as the turn's tool rounds).
            continue
        for directive in directives_in(_text(message)):
            query = f"{FIND_QUERY} ({directive.tag})"
            if query not in found:
                return [ScriptedCall("find_tool", json.dumps({"query": query}))]
            missing = [tag for tag in directive.call_tags() if tag not in called]
            if missing:
                return [
                    ScriptedCall(
                        "call_tool",
                        json.dumps(
                            {"name": MARK_TOOL, "arguments": {"tag": tag, "wait": directive.wait_s}}
                        ),
                    )
                    for tag in missing
                ]
    return None


def _offers(body: dict[str, Any], name: str) -> bool:
    tools = body.get("tools")
    if not isinstance(tools, list):
        return False
    return any(
        isinstance(tool, dict) and tool.get("function", {}).get("name") == name for tool in tools
    )


def mark_tool_toml(marks: str) -> str:
    """brokerd's catalogue entry for ``mark_ticket``: each run appends its tag to ``marks`` (the
    ground truth of how often a tool ran), then sleeps ``wait`` seconds, so a kill can land while
    it runs."""
    argv = ["/bin/sh", "-c", 'echo "$1" >> "$2"; sleep "$3"; echo "marked $1"']
    folder = marks.rpartition("/")[0]
    return "\n".join(
        [
            f'name = "{MARK_TOOL}"',
            'description = "Mark a ticket as done: records the ticket tag once."',
            "timeout_s = 60",
            "output_cap_bytes = 4096",
            # It writes a host file, so it would ask for approval; the soak's users are scripted.
            'approval = "auto"',
            "",
            "[parameters]",
            'type = "object"',
            'required = ["tag"]',
            "additionalProperties = false",
            "",
            "[parameters.properties.tag]",
            'type = "string"',
            'pattern = "^[a-z0-9-]{1,40}$"',
            "",
            "[parameters.properties.wait]",
            'type = "integer"',
            "minimum = 0",
            "maximum = 9",
            "default = 0",
            "",
            "[run]",
            'kind = "command"',
            f"argv = {json.dumps([*argv, 'sh', '{tag}', marks, '{wait}'])}",
            "[confine]",
            f"read_write = {json.dumps([folder])}",
            "",
        ]
    )
