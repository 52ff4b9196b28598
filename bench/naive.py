"""The baseline: a chat client written the way common clients are.

It keeps the conversation as parsed fields and rebuilds every message for every request, which is
where prompt caches are lost:

- the system line carries the current time, so the prompt changes near its start each request;
- an assistant message is rebuilt from its parsed fields: ``reasoning_content`` is dropped, and
  each tool call's arguments are parsed when received and re-dumped with ``json.dumps`` (spaces
  after ``:`` and ``,``) when sent;
- the body goes out through httpx's ``json=``, without a slot: the server picks one.

Sampling and ``max_tokens`` are the same as loopd's, so the two differ only in message handling.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import httpx

from bench.errors import BenchError

CHAT_PATH = "/v1/chat/completions"


@dataclass
class ParsedToolCall:
    id: str
    name: str
    arguments: dict[str, Any]


@dataclass
class ParsedMessage:
    role: str
    content: str | None = None
    tool_calls: list[ParsedToolCall] = field(default_factory=list)
    tool_call_id: str | None = None


@dataclass(frozen=True)
class NaiveReply:
    message: dict[str, Any]  # the assistant message as the server returned it
    timings: dict[str, Any]
    finish_reason: str | None


def parse_assistant(message: Mapping[str, Any]) -> ParsedMessage:
    """Keep the fields a typical client keeps: content and tool calls with parsed arguments."""
    calls = [
        ParsedToolCall(
            id=str(call["id"]),
            name=str(call["function"]["name"]),
            arguments=_parse_arguments(call["function"].get("arguments") or "{}"),
        )
        for call in message.get("tool_calls") or ()
    ]
    return ParsedMessage("assistant", message.get("content"), calls)


def _parse_arguments(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        return {"raw": text}  # what such clients fall back to when the model writes bad JSON
    return value if isinstance(value, dict) else {"value": value}


def render(message: ParsedMessage) -> dict[str, Any]:
    """One message as the client sends it, rebuilt from its fields."""
    wire: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        wire["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
            }
            for call in message.tool_calls
        ]
    if message.tool_call_id is not None:
        wire["tool_call_id"] = message.tool_call_id
    return wire


class NaiveHarness:
    """A conversation held as parsed fields, re-rendered in full for every request."""

    def __init__(
        self,
        http: httpx.AsyncClient,
        *,
        model: str,
        system_text: str,
        tools: Sequence[Mapping[str, Any]],
        sampling: Mapping[str, Any],
        clock: Callable[[], datetime] = datetime.now,
    ) -> None:
        self.http = http
        self.model = model
        self.system_text = system_text
        self.tools = [dict(tool) for tool in tools]
        self.sampling = dict(sampling)
        self.clock = clock
        self.history: list[ParsedMessage] = []

    def add_user(self, text: str) -> None:
        self.history.append(ParsedMessage("user", text))

    def add_assistant(self, message: Mapping[str, Any]) -> ParsedMessage:
        parsed = parse_assistant(message)
        self.history.append(parsed)
        return parsed

    def add_tool_result(self, call_id: str, content: str) -> None:
        self.history.append(ParsedMessage("tool", content, tool_call_id=call_id))

    def system_line(self) -> str:
        return f"{self.system_text}\nCurrent time: {self.clock():%Y-%m-%d %H:%M:%S}"

    def messages(self) -> list[dict[str, Any]]:
        system = {"role": "system", "content": self.system_line()}
        return [system, *(render(message) for message in self.history)]

    def body(self, max_tokens: int) -> dict[str, Any]:
        return {
            "model": self.model,
            "messages": self.messages(),
            "tools": self.tools,
            "max_tokens": max_tokens,
            **self.sampling,
        }

    async def complete(self, max_tokens: int, timeout_s: float = 900.0) -> NaiveReply:
        """One request, answered as a whole (no streaming)."""
        try:
            response = await self.http.post(
                CHAT_PATH, json=self.body(max_tokens), timeout=timeout_s
            )
        except httpx.HTTPError as exc:
            raise BenchError(f"the naive client's request failed: {exc!r}") from exc
        if response.status_code != 200:
            raise BenchError(
                f"the server refused the naive client ({response.status_code}): "
                f"{response.text[:300]}"
            )
        data = response.json()
        choice = data["choices"][0]
        return NaiveReply(choice["message"], data.get("timings") or {}, choice.get("finish_reason"))
