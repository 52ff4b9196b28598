"""The baseline: a chat client written the way common clients are.

It keeps the conversation as parsed fields and rebuilds every message for every request, which is
where prompt caches are lost. Its mistakes are named (``Mistake``), so a run can make all of them
(the baseline) or one alone (to see what each one costs):

- *time in the system line*: the prompt changes near its start on every request. The time moves
  on by a minute a request (``request_clock``), as a person's messages are minutes apart: read
  from the wall clock to the second, two requests of a fast model would share a stamp and the
  cache would survive by luck, so the ratio would depend on the server's speed;
- *reasoning dropped*: an assistant message is rebuilt without its ``reasoning_content``;
- *arguments re-dumped*: each tool call's arguments are parsed when received and re-dumped with
  ``json.dumps`` (spaces after ``:`` and ``,``) when sent.

The body goes out through httpx's ``json=``, without a slot: the server picks one. Sampling and
``max_tokens`` are the same as loopd's, so the two differ only in message handling.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Final

import httpx

from bench.errors import BenchError

CHAT_PATH = "/v1/chat/completions"


class Mistake(StrEnum):
    TIME_IN_SYSTEM_LINE = "time in the system line"
    REASONING_DROPPED = "reasoning dropped"
    ARGUMENTS_REDUMPED = "arguments re-dumped"


EVERY_MISTAKE: Final = frozenset(Mistake)
REQUEST_STEP: Final = timedelta(minutes=1)


def request_clock(start: datetime = datetime(2026, 1, 5, 9, 0, 0)) -> Callable[[], datetime]:
    """A clock a minute later at each reading (the naive client reads it once a request)."""
    steps = itertools.count()
    return lambda: start + REQUEST_STEP * next(steps)


@dataclass
class ParsedToolCall:
    id: str
    name: str
    arguments: dict[str, Any]
    # The arguments as the server sent them, where they are JSON: the server refuses a request
    # whose history holds arguments it cannot parse, so even a careful client re-dumps those.
    received: str


@dataclass
class ParsedMessage:
    role: str
    content: str | None = None
    tool_calls: list[ParsedToolCall] = field(default_factory=list)
    tool_call_id: str | None = None
    reasoning: str | None = None


@dataclass(frozen=True)
class NaiveReply:
    message: dict[str, Any]  # the assistant message as the server returned it
    timings: dict[str, Any]
    finish_reason: str | None


def parse_assistant(message: Mapping[str, Any]) -> ParsedMessage:
    """Keep the fields a typical client keeps: content and tool calls with parsed arguments
    (and what it would drop, for the runs that make one mistake only)."""
    calls = [
        ParsedToolCall(
            id=str(call["id"]),
            name=str(call["function"]["name"]),
            arguments=_parse_arguments(call["function"].get("arguments") or "{}"),
            received=_as_received(str(call["function"].get("arguments") or "{}")),
        )
        for call in message.get("tool_calls") or ()
    ]
    reasoning = message.get("reasoning_content")
    return ParsedMessage(
        "assistant", message.get("content"), calls, reasoning=reasoning if reasoning else None
    )


def _as_received(text: str) -> str:
    try:
        json.loads(text)
    except ValueError:
        return json.dumps(_parse_arguments(text))
    return text


def _parse_arguments(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        return {"raw": text}  # what such clients fall back to when the model writes bad JSON
    return value if isinstance(value, dict) else {"value": value}


def render(message: ParsedMessage, mistakes: frozenset[Mistake] = EVERY_MISTAKE) -> dict[str, Any]:
    """One message as the client sends it, rebuilt from its fields."""
    wire: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.reasoning is not None and Mistake.REASONING_DROPPED not in mistakes:
        wire["reasoning_content"] = message.reasoning
    if message.tool_calls:
        redumped = Mistake.ARGUMENTS_REDUMPED in mistakes
        wire["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {
                    "name": call.name,
                    "arguments": json.dumps(call.arguments) if redumped else call.received,
                },
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
        clock: Callable[[], datetime] | None = None,
        mistakes: frozenset[Mistake] = EVERY_MISTAKE,
    ) -> None:
        self.http = http
        self.model = model
        self.system_text = system_text
        self.tools = [dict(tool) for tool in tools]
        self.sampling = dict(sampling)
        self.clock = clock if clock is not None else request_clock()
        self.mistakes = mistakes
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
        if Mistake.TIME_IN_SYSTEM_LINE not in self.mistakes:
            return self.system_text
        return f"{self.system_text}\nCurrent time: {self.clock():%Y-%m-%d %H:%M:%S}"

    def messages(self) -> list[dict[str, Any]]:
        system = {"role": "system", "content": self.system_line()}
        return [system, *(render(message, self.mistakes) for message in self.history)]

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
