"""Typed events of a streamed chat completion, parsed from SSE payloads. Pure: no I/O.

One server chunk can carry several things (a progress report and the repeated role marker, a
delta and its running `timings`, the usage and the final `timings`), so parsing a payload yields a
list. Within a chunk the order is fixed: `ChunkMeta`, `Progress`, `RoleStart`, the deltas
(reasoning, content, tool calls, as the server orders them), `Finish`, `Usage`, `Timings`. Timings
come after the deltas because their counters already include the token those deltas carry.

Nothing raises out of this module on bad input: a payload that is not JSON, or whose known fields
have the wrong type, becomes one `Malformed` event holding the raw text. Unknown keys are ignored,
so a newer server that adds fields still parses.
"""

import json
from dataclasses import dataclass
from typing import Any

from loopd.wire.sse import SSEComment, SSEData, SSEDecoder, SSEForeign, SSEItem, SSEOverflow

__all__ = [
    "ChunkMeta",
    "ContentDelta",
    "Done",
    "EventDecoder",
    "Finish",
    "Foreign",
    "KeepAlive",
    "Malformed",
    "Progress",
    "ReasoningDelta",
    "RoleStart",
    "ServerError",
    "StreamEvent",
    "Timings",
    "ToolCallDelta",
    "Usage",
    "events_from_item",
    "parse_payload",
]


@dataclass(frozen=True, slots=True)
class ChunkMeta:
    """Sent first for every chunk: the completion id (``chatcmpl-...``, the control call's key)
    and the model name the server reports."""

    completion_id: str
    model: str


@dataclass(frozen=True, slots=True)
class Progress:
    """Prompt processing: `processed` of `total` prompt tokens are in the KV cache, `cache` of
    them were reused; `time_ms` since processing began."""

    total: int
    cache: int
    processed: int
    time_ms: float


@dataclass(frozen=True, slots=True)
class RoleStart:
    """The ``role: assistant`` marker. It repeats with every progress chunk: not a boundary."""


@dataclass(frozen=True, slots=True)
class ContentDelta:
    text: str


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    text: str


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """A piece of tool call `index`: `id` and `name` only when they are new or changed,
    `arguments` a fragment of the argument text (possibly empty)."""

    index: int
    id: str | None
    name: str | None
    arguments: str


@dataclass(frozen=True, slots=True)
class Timings:
    """The server's running counters for this request, under the server's own field names."""

    cache_n: int
    prompt_n: int
    predicted_n: int
    prompt_ms: float
    predicted_ms: float
    prompt_per_second: float
    predicted_per_second: float


@dataclass(frozen=True, slots=True)
class Finish:
    reason: str


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int | None


@dataclass(frozen=True, slots=True)
class Done:
    """``data: [DONE]``: the server ended the stream normally."""


@dataclass(frozen=True, slots=True)
class ServerError:
    """``data: {"error": {...}}``: the server gave up mid-stream; no ``[DONE]`` follows."""

    code: int | None
    message: str
    type: str


@dataclass(frozen=True, slots=True)
class KeepAlive:
    """A comment line; the server pings with an empty one after a silence."""

    comment: str


@dataclass(frozen=True, slots=True)
class Foreign:
    """A line outside the SSE framing, e.g. ``proxy error: <reason>`` from a router."""

    line: str


@dataclass(frozen=True, slots=True)
class Malformed:
    """A payload that is not JSON or not shaped like a chunk; `raw` is the payload as received."""

    raw: str
    reason: str


StreamEvent = (
    ChunkMeta
    | Progress
    | RoleStart
    | ContentDelta
    | ReasoningDelta
    | ToolCallDelta
    | Timings
    | Finish
    | Usage
    | Done
    | ServerError
    | KeepAlive
    | Foreign
    | Malformed
)

_DONE = Done()
_ROLE_START = RoleStart()


class _ShapeError(Exception):
    """A known field has the wrong type; internal, always turned into `Malformed`."""


def parse_payload(payload: str) -> list[StreamEvent]:
    """The events carried by one ``data:`` payload. Never raises: bad input becomes `Malformed`."""
    if payload == "[DONE]":
        return [_DONE]
    try:
        chunk = json.loads(payload)
    except ValueError as exc:  # JSONDecodeError, or an integer too long to convert
        return [Malformed(payload, f"not JSON: {exc}")]
    except RecursionError:  # nested deeper than the interpreter's stack: bad input, not a crash
        return [Malformed(payload, "not JSON: nested too deeply")]
    try:
        return _chunk_events(_as_dict(chunk, "payload"))
    except _ShapeError as exc:
        return [Malformed(payload, str(exc))]


def events_from_item(item: SSEItem) -> list[StreamEvent]:
    """The events for one SSE item: a payload's events, a keep-alive, a foreign line, or an
    event past the decoder's bound (``Malformed``: the stream cannot be trusted past it)."""
    match item:
        case SSEData(payload):
            return parse_payload(payload)
        case SSEComment(text):
            return [KeepAlive(text)]
        case SSEForeign(line):
            return [Foreign(line)]
        case SSEOverflow(limit, head):
            reason = f"an event grew past {limit:,} bytes without ending; the rest was not read"
            return [Malformed(head, reason)]


class EventDecoder:
    """Bytes of a response body in, stream events out: `SSEDecoder` plus `parse_payload`."""

    def __init__(self) -> None:
        self._sse = SSEDecoder()

    def feed(self, chunk: bytes) -> list[StreamEvent]:
        return _events(self._sse.feed(chunk))

    def flush(self) -> list[StreamEvent]:
        return _events(self._sse.flush())


def _events(items: list[SSEItem]) -> list[StreamEvent]:
    events: list[StreamEvent] = []
    for item in items:
        events.extend(events_from_item(item))
    return events


def _chunk_events(chunk: dict[str, Any]) -> list[StreamEvent]:
    if "error" in chunk:
        return [_server_error(chunk["error"])]
    events: list[StreamEvent] = [
        ChunkMeta(_as_str(chunk.get("id"), "id"), _as_str(chunk.get("model"), "model"))
    ]
    if "prompt_progress" in chunk:
        events.append(_progress(_as_dict(chunk["prompt_progress"], "prompt_progress")))
    choices = chunk.get("choices")
    if not isinstance(choices, list):
        raise _ShapeError(f"'choices' must be a list, got {_kind(choices)}")
    for position, choice in enumerate(choices):
        events.extend(_choice_events(_as_dict(choice, f"choices[{position}]")))
    if (usage := chunk.get("usage")) is not None:
        events.append(_usage(_as_dict(usage, "usage")))
    if (timings := chunk.get("timings")) is not None:
        events.append(_timings(_as_dict(timings, "timings")))
    return events


def _choice_events(choice: dict[str, Any]) -> list[StreamEvent]:
    # loopd never asks for n > 1; a second choice would interleave with the first.
    if _as_int(choice.get("index", 0), "choice index") != 0:
        raise _ShapeError(f"only choice 0 is supported, got choice {choice['index']}")
    events = _delta_events(_as_dict(choice.get("delta", {}), "delta"))
    if (reason := choice.get("finish_reason")) is not None:
        events.append(Finish(_as_str(reason, "finish_reason")))
    return events


def _delta_events(delta: dict[str, Any]) -> list[StreamEvent]:
    events: list[StreamEvent] = []
    if (role := delta.get("role")) is not None:
        if role != "assistant":
            raise _ShapeError(f"'role' must be 'assistant', got {role!r}")
        events.append(_ROLE_START)
    if reasoning := _optional_str(delta.get("reasoning_content"), "reasoning_content"):
        events.append(ReasoningDelta(reasoning))
    if content := _optional_str(delta.get("content"), "content"):
        events.append(ContentDelta(content))
    if (tool_calls := delta.get("tool_calls")) is not None:
        if not isinstance(tool_calls, list):
            raise _ShapeError(f"'tool_calls' must be a list, got {_kind(tool_calls)}")
        events.extend(_tool_call_delta(_as_dict(call, "tool call")) for call in tool_calls)
    return events


def _tool_call_delta(call: dict[str, Any]) -> ToolCallDelta:
    function = _as_dict(call.get("function", {}), "tool call 'function'")
    return ToolCallDelta(
        index=_as_int(call.get("index"), "tool call 'index'"),
        id=_optional_str(call.get("id"), "tool call 'id'"),
        name=_optional_str(function.get("name"), "tool call 'name'"),
        arguments=_optional_str(function.get("arguments"), "tool call 'arguments'") or "",
    )


def _progress(progress: dict[str, Any]) -> Progress:
    return Progress(
        total=_as_int(progress.get("total"), "prompt_progress 'total'"),
        cache=_as_int(progress.get("cache"), "prompt_progress 'cache'"),
        processed=_as_int(progress.get("processed"), "prompt_progress 'processed'"),
        time_ms=_as_float(progress.get("time_ms"), "prompt_progress 'time_ms'"),
    )


def _timings(timings: dict[str, Any]) -> Timings:
    return Timings(
        cache_n=_as_int(timings.get("cache_n"), "timings 'cache_n'"),
        prompt_n=_as_int(timings.get("prompt_n"), "timings 'prompt_n'"),
        predicted_n=_as_int(timings.get("predicted_n"), "timings 'predicted_n'"),
        prompt_ms=_as_float(timings.get("prompt_ms"), "timings 'prompt_ms'"),
        predicted_ms=_as_float(timings.get("predicted_ms"), "timings 'predicted_ms'"),
        prompt_per_second=_as_float(
            timings.get("prompt_per_second"), "timings 'prompt_per_second'"
        ),
        predicted_per_second=_as_float(
            timings.get("predicted_per_second"), "timings 'predicted_per_second'"
        ),
    )


def _usage(usage: dict[str, Any]) -> Usage:
    details = usage.get("prompt_tokens_details")
    cached = None
    if details is not None:
        cached = _as_int(
            _as_dict(details, "prompt_tokens_details").get("cached_tokens"), "cached_tokens"
        )
    return Usage(
        prompt_tokens=_as_int(usage.get("prompt_tokens"), "usage 'prompt_tokens'"),
        completion_tokens=_as_int(usage.get("completion_tokens"), "usage 'completion_tokens'"),
        cached_tokens=cached,
    )


def _server_error(error: object) -> ServerError:
    if isinstance(error, str):  # not what this server sends, but unmistakably an error
        return ServerError(code=None, message=error, type="")
    fields = _as_dict(error, "error")
    code = fields.get("code")
    return ServerError(
        code=None if code is None else _as_int(code, "error 'code'"),
        message=_optional_str(fields.get("message"), "error 'message'") or "",
        type=_optional_str(fields.get("type"), "error 'type'") or "",
    )


def _as_dict(value: object, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _ShapeError(f"{what} must be an object, got {_kind(value)}")
    return value


def _as_str(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise _ShapeError(f"{what} must be a string, got {_kind(value)}")
    return value


def _optional_str(value: object, what: str) -> str | None:
    return None if value is None else _as_str(value, what)


def _as_int(value: object, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise _ShapeError(f"{what} must be an integer, got {_kind(value)}")
    return value


def _as_float(value: object, what: str) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise _ShapeError(f"{what} must be a number, got {_kind(value)}")
    try:
        return float(value)
    except OverflowError:
        raise _ShapeError(f"{what} is too large for a float") from None


def _kind(value: object) -> str:
    """How a JSON value is named in messages: its JSON type, or 'nothing' when absent."""
    if value is None:
        return "null or nothing"
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), "a number"
    )
