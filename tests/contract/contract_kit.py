"""What the contract tests share: the three servers behind one interface, and a timed stream.

A :class:`Target` names three models by what their template does, so one test body runs on the
real server (SmolLM2, two slots of their own), on the hybrid server (the tiny ``qwen35moe`` on
production's layout: four slots on one unified pool) and on the fake:

- ``plain``: no thinking (the real one: SmolLM2's own template, which renders no tools);
- ``keep``: thinks and renders every assistant turn's reasoning, and renders tools at the top
  (the real one: ``devserver.every_turn_reasoning`` of Qwen3.5's template, as the production model's
  template does);
- ``drop``: thinks and drops the reasoning of turns before the last user message (the real one:
  llama.cpp's Qwen3.5 template).

The tiny model does not call tools by itself, so :meth:`Target.tool_call` arranges a call: on the
real server a trailing assistant message (a prefill) opens the call in the template's format and
the server's own parser turns it into ``tool_calls``; on the fake a scripted reply does.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from loopcommon.jsonbytes import dumps
from loopd.engine.client import InferenceClient
from loopd.wire import (
    ChunkMeta,
    EventDecoder,
    Progress,
    StreamAssembler,
    StreamEvent,
    Timings,
    ToolCallDelta,
)
from loopd_dev.fakes.llama import FakeLlama, ScriptedReply, ScriptedToolCall

Kind = Literal["real", "hybrid", "fake"]
Message = dict[str, Any]


@dataclass(frozen=True)
class Endpoint:
    """One model on one server: ``url`` as loopd takes it (``unix:/path`` or ``http://...``)."""

    url: str
    model: str

    def client(self) -> InferenceClient:
        return InferenceClient(self.url, self.model, connect_s=30.0)


@dataclass
class Target:
    kind: Kind
    plain: Endpoint
    keep: Endpoint
    drop: Endpoint
    fake: FakeLlama | None = None

    @property
    def hybrid(self) -> bool:
        """The hybrid server: its recurrent state can only be rolled back to a checkpoint, its
        random replies do not replay token for token, and its slots share one pool (see
        :func:`hybrid_resume_point` and docs/production-shape.md)."""
        return self.kind == "hybrid"

    def tool_call(
        self, endpoint: Endpoint, name: str, arguments: dict[str, Any], *, open_last: bool = False
    ) -> list[Message]:
        """Arrange for the next reply on ``endpoint`` to call ``name`` with ``arguments``.

        Returns the messages to append to the request (a prefill on the real server). With
        ``open_last`` the last argument is left for the model to finish (real server only; the
        fake streams the whole scripted value token by token).
        """
        if self.fake is not None:
            call = ScriptedToolCall(name, dumps(arguments))
            self.fake.push(ScriptedReply(tool_calls=(call,)), model=endpoint.model)
            return []
        # The hybrid model writes random text and never closes a call itself: its prefill is
        # the whole call, unless the test wants a value left open.
        prefill = qwen_call_prefill(name, arguments, open_last, closed=self.hybrid)
        return [{"role": "assistant", "content": prefill}]

    def resend_floor(self, prompt_tokens: int) -> int:
        """The least ``cache_n`` of a prompt of ``prompt_tokens`` sent again to a slot that holds
        it: the server re-evaluates at least its last token, and a hybrid model's recurrent state
        can only go back to the checkpoint before it (see :func:`hybrid_resume_point`)."""
        back = CHECKPOINT_BEFORE_END if self.hybrid else 1
        return prompt_tokens - back


def qwen_call_prefill(
    name: str, arguments: dict[str, Any], open_last: bool, *, closed: bool = False
) -> str:
    """A call opened in the Qwen3.5 XML format; values rendered as the template renders them.
    ``closed``: the call is written to its end (``</tool_call>``)."""
    parts = [f"<tool_call>\n<function={name}>\n"]
    items = list(arguments.items())
    for position, (key, value) in enumerate(items):
        text = value if isinstance(value, str) else dumps(value)
        if open_last and position == len(items) - 1:
            parts.append(f"<parameter={key}>\n{text}")
        else:
            parts.append(f"<parameter={key}>\n{text}\n</parameter>\n")
    if closed and not open_last:
        parts.append("</function>\n</tool_call>")
    return "".join(parts)


def chat_body(endpoint: Endpoint, messages: list[Message], **fields: Any) -> dict[str, Any]:
    """A streamed, greedy chat request; ``fields`` override or add anything."""
    body: dict[str, Any] = {
        "model": endpoint.model,
        "messages": messages,
        "stream": True,
        "cache_prompt": True,
        "temperature": 0,
        "max_tokens": 16,
    }
    body.update(fields)
    return body


@dataclass
class Streamed:
    """One streamed completion, with when each thing arrived (seconds since it was sent)."""

    assembler: StreamAssembler = field(default_factory=StreamAssembler)
    headers_at: float | None = None
    data_at: list[float] = field(default_factory=list)  # one entry per data event
    progress_at: list[float] = field(default_factory=list)
    progress: list[Progress] = field(default_factory=list)
    per_token: list[Timings] = field(default_factory=list)  # every Timings, the last included
    tool_deltas: list[ToolCallDelta] = field(default_factory=list)
    closed_early: bool = False
    ended_at: float | None = None

    @property
    def timings(self) -> Timings:
        assert self.assembler.timings is not None, "the stream carried no timings"
        return self.assembler.timings

    def replay(self) -> Message:
        """The assistant message exactly as streamed, to send back on the next request."""
        return self.assembler.message().to_wire()


StopWhen = Callable[[Streamed, StreamEvent], bool]
Watch = Callable[[Streamed, StreamEvent], Awaitable[None]]


async def stream(
    endpoint: Endpoint,
    body: dict[str, Any],
    *,
    stop_when: StopWhen | None = None,
    on_headers: Callable[[], Any] | None = None,
    watch: Watch | None = None,
) -> Streamed:
    """Send ``body`` and read the stream to its end, or until ``stop_when`` says to hang up."""
    out = Streamed()
    decoder = EventDecoder()
    started = time.monotonic()
    async with endpoint.client() as client, client.stream_chat(dumps(body).encode()) as response:
        out.headers_at = time.monotonic() - started
        if on_headers is not None:
            on_headers()
        async for chunk in response.aiter_raw():
            now = time.monotonic() - started
            for event in decoder.feed(chunk):
                _note(out, event, now)
                if watch is not None:
                    await watch(out, event)
                if stop_when is not None and stop_when(out, event):
                    out.closed_early = True
                    return out
    for event in decoder.flush():
        _note(out, event, time.monotonic() - started)
    out.ended_at = time.monotonic() - started
    return out


def _note(out: Streamed, event: StreamEvent, now: float) -> None:
    out.assembler.apply(event)
    match event:
        case Progress():
            out.progress.append(event)
            out.progress_at.append(now)
        case Timings():
            out.per_token.append(event)
        case ToolCallDelta():
            out.tool_deltas.append(event)
        case ChunkMeta():
            out.data_at.append(now)


async def complete(endpoint: Endpoint, messages: list[Message], **fields: Any) -> Streamed:
    """One streamed request that must end normally."""
    result = await stream(endpoint, chat_body(endpoint, messages, **fields))
    assert result.assembler.done, result.assembler.problems
    return result


def cost(result: Streamed) -> tuple[int, int, int]:
    """(cache_n, prompt_n, predicted_n) of a finished request."""
    t = result.timings
    return (t.cache_n, t.prompt_n, t.predicted_n)


def carried_forward(previous: Streamed) -> int:
    """The tokens the slot holds after ``previous`` (prompt and generated, less the last sampled
    one): what the next request reuses when it replays ``previous`` exactly."""
    cache_n, prompt_n, predicted_n = cost(previous)
    return cache_n + prompt_n + predicted_n - 1


# The server checkpoints a hybrid model's recurrent state this many tokens before the end of every
# prompt it processes (llama.cpp build 11434, server-context.cpp, ``checkpoint_offsets``).
CHECKPOINT_BEFORE_END = 4


def hybrid_resume_point(previous: Streamed) -> int:
    """Where the hybrid server resumes the next request of a conversation that replays
    ``previous``: at the checkpoint 4 tokens before the end of ``previous``'s prompt.

    The next prompt diverges from what the slot holds inside ``previous``'s reply: the
    random model writes tokens side by side that the tokenizer, reading the replayed text, merges
    into other tokens (a trained model's reply replays token for token). A pure transformer
    resumes exactly at the divergence; the recurrent state can only go back to a checkpoint, the
    server takes none while generating, and the latest one before the divergence is this one.
    """
    cache_n, prompt_n, _ = cost(previous)
    return cache_n + prompt_n - CHECKPOINT_BEFORE_END


async def is_processing(endpoint: Endpoint, slot: int) -> bool:
    async with endpoint.client() as client:
        return await client.slot_busy(slot)


def tool(name: str, description: str, properties: dict[str, Any], required: list[str]) -> Any:
    schema = {"type": "object", "properties": properties, "required": required}
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": schema},
    }


READ_FILE = tool("read_file", "Read a file.", {"path": {"type": "string"}}, ["path"])
WRITE_FILE = tool(
    "write_file",
    "Write a file.",
    {"path": {"type": "string"}, "content": {"type": "string"}},
    ["path", "content"],
)
RUN_COMMAND = tool(
    "run_command",
    "Run a shell command.",
    {
        "command": {"type": "string"},
        "timeout_s": {"type": "integer"},
        "headers": {"type": "object"},
    },
    ["command", "timeout_s"],
)
FIND_TOOL = tool("find_tool", "Find a tool by what it does.", {"query": {"type": "string"}}, [])
CALL_TOOL = tool(
    "call_tool",
    "Call a tool that find_tool returned.",
    {"name": {"type": "string"}, "arguments": {"type": "object"}},
    ["name", "arguments"],
)
GET_WEATHER = tool("get_weather", "The weather in a city.", {"city": {"type": "string"}}, ["city"])
CORE_TOOLS = [READ_FILE, WRITE_FILE, RUN_COMMAND, FIND_TOOL, CALL_TOOL]


async def tokens_before(endpoint: Endpoint, body: dict[str, Any], marker: str) -> int:
    """How many prompt tokens come before ``marker`` in the prompt ``body`` renders to."""
    async with endpoint.client() as client:
        rendered = await client.post_json("/apply-template", body, 60)
        prompt: str = rendered["prompt"]
        head = prompt[: prompt.index(marker)]
        tokens = await client.post_json(
            "/tokenize", {"model": endpoint.model, "content": head, "parse_special": True}, 60
        )
    return len(tokens["tokens"])
