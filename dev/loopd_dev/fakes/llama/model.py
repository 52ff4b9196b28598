"""A scripted model: deterministic output, or replies a test pushed, generated token by token.

:class:`Generation` walks the tokens of the assistant turn's text (the same text the template
renders for a replayed turn) and turns each token into stream deltas. A reasoning-end request
(the control call) rewrites the rest of the turn: the budget message and the end tag are forced,
then the answer follows.
"""

import random
import string
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from .messages import Message, ToolCallText
from .render import AssistantText, Part, render_assistant_body
from .tokenize import EOS, Token, tokenize_with_offsets

FinishReason = Literal["stop", "length", "tool_calls"]
_ALNUM = string.ascii_letters + string.digits


@dataclass(frozen=True)
class ScriptedToolCall:
    """A tool call the model will write; ``arguments`` is streamed and returned byte for byte."""

    name: str
    arguments: str
    id: str | None = None


@dataclass(frozen=True)
class ScriptedReply:
    """One reply: reasoning, content, tool calls, and optionally the finish reason to report."""

    reasoning: str = ""
    content: str = ""
    tool_calls: tuple[ScriptedToolCall, ...] = ()
    finish_reason: FinishReason | None = None

    @classmethod
    def from_json(cls, raw: Any) -> "ScriptedReply":
        """Build from the ``/_fake/script`` wire form; a bad shape raises ValueError/TypeError."""
        if not isinstance(raw, dict):
            raise TypeError("a scripted reply must be an object")
        unknown = set(raw) - {"reasoning", "content", "tool_calls", "finish_reason"}
        if unknown:
            raise ValueError(f"unknown scripted reply keys: {sorted(unknown)}")
        calls = tuple(
            ScriptedToolCall(str(c["name"]), str(c["arguments"]), c.get("id"))
            for c in raw.get("tool_calls", ())
        )
        finish = raw.get("finish_reason")
        if finish not in (None, "stop", "length", "tool_calls"):
            raise ValueError(f"bad finish_reason: {finish!r}")
        return cls(str(raw.get("reasoning", "")), str(raw.get("content", "")), calls, finish)


def random_id(rng: random.Random, length: int = 32) -> str:
    """The server's id shape: alphanumeric, no prefix."""
    return "".join(rng.choice(_ALNUM) for _ in range(length))


class ScriptedModel:
    """The queue of replies for one model; when empty, a deterministic reply from the prompt."""

    def __init__(self, *, thinking: bool = True) -> None:
        self._queue: deque[ScriptedReply] = deque()
        self._thinking = thinking

    def push(self, *replies: ScriptedReply) -> None:
        self._queue.extend(replies)

    def clear(self) -> None:
        self._queue.clear()

    @property
    def pending(self) -> int:
        return len(self._queue)

    def next_reply(self, messages: Sequence[Message]) -> ScriptedReply:
        if self._queue:
            return self._queue.popleft()
        reply = default_reply(messages)
        return reply if self._thinking else ScriptedReply(content=reply.content)


def default_reply(messages: Sequence[Message]) -> ScriptedReply:
    """A short reply that depends only on the last message, so replays are deterministic."""
    last = messages[-1].content if messages else ""
    words = last.split()
    echo = " ".join(words[:12])
    return ScriptedReply(
        reasoning=f"The message has {len(words)} words. I will answer briefly.",
        content=f"You said: {echo}" if echo else "Hello.",
    )


@dataclass
class ToolCallDelta:
    index: int
    arguments: str
    header: tuple[str, str] | None = None  # (id, name) on the call's first delta


@dataclass
class Step:
    """One generated token and what it shows in the stream."""

    piece: str
    reasoning: str = ""
    content: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)

    def delta(self) -> dict[str, Any]:
        """The chunk's ``delta``: only non-empty keys, as the real server writes it."""
        out: dict[str, Any] = {}
        if self.reasoning:
            out["reasoning_content"] = self.reasoning
        if self.content:
            out["content"] = self.content
        if self.tool_calls:
            out["tool_calls"] = [_tool_call_delta_json(d) for d in self.tool_calls]
        return out


def _tool_call_delta_json(delta: ToolCallDelta) -> dict[str, Any]:
    if delta.header is None:
        return {"index": delta.index, "function": {"arguments": delta.arguments}}
    call_id, name = delta.header
    return {
        "index": delta.index,
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": delta.arguments},
    }


class Generation:
    """Token-by-token output of one reply, with reasoning-end forcing and a finish reason."""

    def __init__(
        self,
        reply: ScriptedReply,
        call_ids: Sequence[str],
        budget_message: str = "",
        *,
        ignore_eos: bool = False,
    ) -> None:
        self._reply = reply
        self._ignore_eos = ignore_eos
        self._calls = tuple(
            ToolCallText(c.name, c.arguments, c.id or call_ids[i])
            for i, c in enumerate(reply.tool_calls)
        )
        self._budget_message = budget_message
        self._text = render_assistant_body(reply.reasoning, reply.content, self._calls)
        self._tokens = self._tokenize(self._text)
        self._next = 0
        self._force_pending = False
        self._forced = False
        self._started_calls: set[int] = set()
        self.steps = 0  # tokens written so far, forced and filler ones included
        self._watches: list[tuple[int, Callable[[], object]]] = []
        self.reasoning = ""
        self.content = ""
        self.arguments = ["" for _ in self._calls]

    @staticmethod
    def _tokenize(text: AssistantText) -> list[Token]:
        return tokenize_with_offsets(text.text + EOS)

    @property
    def in_reasoning(self) -> bool:
        """True while reasoning text is still being written (where forcing has an effect)."""
        position = self._tokens[self._next - 1].end if self._next else 0
        return any(
            s.part is Part.REASONING and s.start <= position < s.end for s in self._text.spans
        ) or self._just_opened_think(position)

    def _just_opened_think(self, position: int) -> bool:
        return self._text.text.startswith("<think>\n") and 0 < position <= len("<think>\n")

    def when_written(self, tokens: int, then: Callable[[], object]) -> None:
        """Call ``then`` once ``tokens`` more tokens are written, or at ``end``."""
        self._watches.append((self.steps + tokens, then))
        self._call_due()

    def end(self) -> None:
        """The completion left its slot (finished, or its client gone): every watch is called."""
        watches, self._watches = self._watches, []
        for _, then in watches:
            then()

    def _call_due(self) -> None:
        due = [then for at, then in self._watches if at <= self.steps]
        self._watches = [(at, then) for at, then in self._watches if at > self.steps]
        for then in due:
            then()

    def request_reasoning_end(self) -> None:
        """The control call: applied before the next token, if reasoning is still running."""
        if self.in_reasoning and not self._forced:
            self._force_pending = True

    def next_step(self) -> Step | None:
        """The next token, or None after the end-of-turn token."""
        if self._force_pending:
            self._apply_reasoning_end()
        if self._next >= len(self._tokens):
            return None
        self.steps += 1
        if self._watches:  # a token's step stays as cheap as before when nothing watches
            self._call_due()
        if self._ignore_eos and self._next == len(self._tokens) - 1:
            # The end-of-turn token is banned: the model keeps writing, as the real one does.
            return self._filler_step()
        token = self._tokens[self._next]
        self._next += 1
        return self._step(token)

    @property
    def finish_reason(self) -> FinishReason:
        if self._reply.finish_reason is not None and not self._forced:
            return self._reply.finish_reason
        return "tool_calls" if self._calls else "stop"

    @property
    def tool_calls(self) -> list[ToolCallText]:
        """The calls written so far, with their argument text as streamed."""
        return [
            ToolCallText(c.name, self.arguments[i], c.id)
            for i, c in enumerate(self._calls)
            if i in self._started_calls
        ]

    def _apply_reasoning_end(self) -> None:
        self._force_pending = False
        self._forced = True
        forced = self.reasoning + self._budget_message
        self._text = render_assistant_body(
            forced, self._reply.content, self._calls, think_block=True
        )
        # Tokens already sent stay as they were; only the text after them is tokenized anew, as
        # a sampler forcing tokens would. The replayed turn may tokenize differently at the seam.
        position = self._tokens[self._next - 1].end if self._next else 0
        rest = tokenize_with_offsets(self._text.text[position:] + EOS)
        shifted = [Token(t.piece, t.start + position) for t in rest]
        self._tokens = self._tokens[: self._next] + shifted

    def _filler_step(self) -> Step:
        piece = " and"
        if self._reply.tool_calls:
            return Step(piece)  # text after a call is not parsed into anything visible
        self.content += piece
        return Step(piece, content=piece)

    def _step(self, token: Token) -> Step:
        step = Step(token.piece)
        for span in self._text.spans:
            start, end = max(span.start, token.start), min(span.end, token.end)
            if start >= end or span.part is Part.MARKUP:
                continue
            text = self._text.text[start:end]
            if span.part is Part.REASONING:
                step.reasoning += text
                self.reasoning += text
            elif span.part is Part.CONTENT:
                step.content += text
                self.content += text
            else:
                step.tool_calls.append(self._call_delta(span.call_index, text))
        return step

    def _call_delta(self, index: int, text: str) -> ToolCallDelta:
        self.arguments[index] += text
        if index in self._started_calls:
            return ToolCallDelta(index, text)
        self._started_calls.add(index)
        call = self._calls[index]
        return ToolCallDelta(index, text, header=(call.id, call.name))
