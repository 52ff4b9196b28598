"""Folding stream events into the assistant message, exactly as the server streamed it.

The assembled message is what loopd replays on the next request, so nothing here interprets the
text: content and reasoning are the deltas concatenated, and each tool call's `arguments` is its
fragments concatenated, never parsed or re-dumped (a re-dump could change spacing or key order and
break the prompt cache).

Thinking tokens are counted from the server's own counter, `timings.predicted_n` (sent with every
token when the request has `timings_per_token`). The rule: after the first reasoning delta and
until the first content or tool-call delta, each `Timings` sets `thinking_tokens` to its
`predicted_n`; after that the count stays frozen. `predicted_n` includes hidden markup tokens
(``<think>``), which do cost generation time. A chunk that both ends reasoning and starts the
answer is not counted, so the figure can be one token low; a model that reopens reasoning after
answering is not counted again. Both are fine for a thinking cap.
"""

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from loopd.wire.events import (
    ChunkMeta,
    ContentDelta,
    Done,
    Finish,
    Foreign,
    KeepAlive,
    Malformed,
    Progress,
    ReasoningDelta,
    RoleStart,
    ServerError,
    StreamEvent,
    Timings,
    ToolCallDelta,
    Usage,
)

__all__ = ["AssistantMessage", "StreamAssembler", "StreamOutcome", "ToolCall"]


class StreamOutcome(StrEnum):
    """How a stream ended, as far as the events seen so far tell."""

    COMPLETE = "complete"  # a finish_reason and then [DONE]
    ERROR = "error"  # a server error, a malformed chunk or a broken protocol
    TRUNCATED = "truncated"  # ended (or not yet ended) without [DONE]


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # the exact text the server streamed, JSON in a well-formed call

    def to_wire(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(frozen=True, slots=True)
class AssistantMessage:
    content: str
    reasoning_content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()

    def to_wire(self) -> dict[str, Any]:
        """The message to replay, keys in a fixed order so its serialization never changes.

        `content` is null only for an empty answer that calls tools (the server's own choice for
        such turns); `reasoning_content` is left out when empty because the server rejects null.
        """
        wire: dict[str, Any] = {
            "role": "assistant",
            "content": self.content or (None if self.tool_calls else ""),
        }
        if self.reasoning_content:
            wire["reasoning_content"] = self.reasoning_content
        if self.tool_calls:
            wire["tool_calls"] = [call.to_wire() for call in self.tool_calls]
        return wire


@dataclass(slots=True)
class _PartialCall:
    id: str | None = None
    name: str | None = None
    argument_parts: list[str] = field(default_factory=list)


class StreamAssembler:
    """Consumes the events of one completion; read its state at any time.

    `problems` lists, in order, everything that makes the stream untrustworthy besides a server
    error: malformed chunks, a changed completion id, events after ``[DONE]``, a second finish,
    a tool call never given an id or a name, ``[DONE]`` without a finish.
    """

    def __init__(self) -> None:
        self.completion_id: str | None = None
        self.model: str | None = None
        self.progress: Progress | None = None
        self.timings: Timings | None = None
        self.usage: Usage | None = None
        self.thinking_tokens = 0
        self.finish_reason: str | None = None
        self.done = False
        self.server_error: ServerError | None = None
        self.foreign_lines: list[str] = []
        self._content: list[str] = []
        self._reasoning: list[str] = []
        self._calls: dict[int, _PartialCall] = {}
        self._answer_started = False
        self._problems: list[str] = []

    def apply_all(self, events: Iterable[StreamEvent]) -> None:
        for event in events:
            self.apply(event)

    def apply(self, event: StreamEvent) -> None:
        if self.done and not isinstance(event, KeepAlive | Foreign):
            self._problems.append(f"event after [DONE]: {event!r}")
        match event:
            case ChunkMeta():
                self._meta(event)
            case Progress():
                self.progress = event
            case RoleStart():
                pass  # repeats with every progress chunk; carries nothing
            case ReasoningDelta(text):
                self._reasoning.append(text)
            case ContentDelta(text):
                self._content.append(text)
                self._answer_started = True
            case ToolCallDelta():
                self._tool_call(event)
                self._answer_started = True
            case Timings():
                self._timings(event)
            case Finish(reason):
                self._finish(reason)
            case Usage():
                self.usage = event
            case Done():
                self.done = True
            case ServerError():
                self.server_error = self.server_error or event
            case KeepAlive():
                pass
            case Foreign(line):
                self.foreign_lines.append(line)
            case Malformed(raw, reason):
                self._problems.append(f"malformed chunk ({reason}): {raw!r}")

    @property
    def answer_started(self) -> bool:
        """Content or a tool call has begun: thinking is over."""
        return self._answer_started

    @property
    def content(self) -> str:
        return "".join(self._content)

    @property
    def reasoning(self) -> str:
        return "".join(self._reasoning)

    @property
    def tool_calls(self) -> dict[int, ToolCall]:
        """Tool calls by their stream index; a missing id or name reads as ""."""
        return {
            index: ToolCall(call.id or "", call.name or "", "".join(call.argument_parts))
            for index, call in sorted(self._calls.items())
        }

    @property
    def problems(self) -> list[str]:
        found = list(self._problems)
        for index, call in sorted(self._calls.items()):
            if call.id is None or call.name is None:
                found.append(f"tool call {index} has no {'id' if call.id is None else 'name'}")
        if self.done and self.finish_reason is None:
            found.append("[DONE] without a finish_reason")
        return found

    @property
    def outcome(self) -> StreamOutcome:
        if self.server_error is not None or self.problems:
            return StreamOutcome.ERROR
        if self.done:
            return StreamOutcome.COMPLETE
        return StreamOutcome.TRUNCATED

    def message(self) -> AssistantMessage:
        """The message as streamed so far; replay it only when `outcome` is COMPLETE."""
        return AssistantMessage(
            content=self.content,
            reasoning_content=self.reasoning,
            tool_calls=tuple(self.tool_calls.values()),
        )

    def _meta(self, meta: ChunkMeta) -> None:
        if self.completion_id is None:
            self.completion_id, self.model = meta.completion_id, meta.model
        elif meta.completion_id != self.completion_id:
            self._problems.append(
                f"completion id changed from {self.completion_id!r} to {meta.completion_id!r}"
            )

    def _tool_call(self, delta: ToolCallDelta) -> None:
        call = self._calls.setdefault(delta.index, _PartialCall())
        # The server resends id or name only when it changed: a new value replaces the old.
        if delta.id is not None:
            call.id = delta.id
        if delta.name is not None:
            call.name = delta.name
        call.argument_parts.append(delta.arguments)

    def _timings(self, timings: Timings) -> None:
        self.timings = timings
        if self._reasoning and not self._answer_started:
            self.thinking_tokens = timings.predicted_n

    def _finish(self, reason: str) -> None:
        if self.finish_reason is None:
            self.finish_reason = reason
        else:
            self._problems.append(f"second finish_reason {reason!r} after {self.finish_reason!r}")
