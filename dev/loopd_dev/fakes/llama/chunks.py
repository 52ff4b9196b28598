"""The JSON objects of a chat completion, built exactly as the real server emits them.

Pure functions: key order, the id shape, the role chunk, ``timings`` and ``usage`` all live here,
so the wire format can be checked without a socket.
"""

import time
from dataclasses import dataclass
from typing import Any

from loopcommon.jsonbytes import dumps

from .messages import ToolCallText

ROLE_DELTA: dict[str, Any] = {"role": "assistant", "content": None}
DONE = b"data: [DONE]\n\n"
PING = b":\n\n"


@dataclass
class Timings:
    """Running totals of one task, serialized like ``server_slot_stats::to_json``."""

    cache_n: int = 0
    prompt_n: int = 0
    prompt_ms: float = 0.0
    predicted_n: int = 0
    predicted_ms: float = 0.0

    def to_json(self) -> dict[str, Any]:
        # The first generated token is "free": generation rates divide by predicted_n - 1.
        steps = self.predicted_n - 1
        return {
            "cache_n": self.cache_n,
            "prompt_n": self.prompt_n,
            "prompt_ms": self.prompt_ms,
            "prompt_per_token_ms": _ratio(self.prompt_ms, self.prompt_n),
            "prompt_per_second": _ratio(1e3 * self.prompt_n, self.prompt_ms),
            "predicted_n": self.predicted_n,
            "predicted_ms": self.predicted_ms,
            "predicted_per_token_ms": _ratio(self.predicted_ms, steps),
            "predicted_per_second": _ratio(1e3 * steps, self.predicted_ms),
        }


def _ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator > 0 else 0.0


@dataclass(frozen=True)
class Identity:
    """What every chunk of one completion repeats."""

    completion_id: str
    model: str
    fingerprint: str


def chunk(identity: Identity, choices: list[Any], **extra: Any) -> dict[str, Any]:
    """A ``chat.completion.chunk``; ``extra`` (usage, timings, prompt_progress) goes last."""
    out: dict[str, Any] = {
        "choices": choices,
        "created": int(time.time()),
        "id": identity.completion_id,
        "model": identity.model,
        "system_fingerprint": identity.fingerprint,
        "object": "chat.completion.chunk",
    }
    out.update(extra)
    return out


def delta_choice(delta: dict[str, Any], finish_reason: str | None = None) -> list[Any]:
    return [{"finish_reason": finish_reason, "index": 0, "delta": delta}]


def usage_json(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {
        "completion_tokens": completion_tokens,
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def progress_json(total: int, cache: int, processed: int, time_ms: int) -> dict[str, Any]:
    return {"total": total, "cache": cache, "processed": processed, "time_ms": time_ms}


def message_json(reasoning: str, content: str, tool_calls: list[ToolCallText]) -> dict[str, Any]:
    """The non-stream ``message``: content is "" when empty; the rest only when present."""
    out: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning:
        out["reasoning_content"] = reasoning
    if tool_calls:
        out["tool_calls"] = [
            {"type": "function", "function": {"name": c.name, "arguments": c.arguments}, "id": c.id}
            for c in tool_calls
        ]
    return out


def completion_json(
    identity: Identity,
    finish_reason: str,
    message: dict[str, Any],
    usage: dict[str, Any],
    timings: Timings,
) -> dict[str, Any]:
    """The non-stream ``chat.completion`` object."""
    return {
        "choices": [{"finish_reason": finish_reason, "index": 0, "message": message}],
        "created": int(time.time()),
        "model": identity.model,
        "system_fingerprint": identity.fingerprint,
        "object": "chat.completion",
        "usage": usage,
        "id": identity.completion_id,
        "timings": timings.to_json(),
    }


def sse_event(value: Any) -> bytes:
    """One ``data:`` event, compact JSON."""
    return b"data: " + dumps(value).encode() + b"\n\n"
