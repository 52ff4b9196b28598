"""Building a chat request's body from stored bytes. Pure.

The body is assembled by concatenating text that was serialized once, when it entered the session
log (the epoch's ``tools`` array and every message; the ``messages`` array is the session log's
own ``replay.messages_array``). Nothing already sent is serialized again, so request k+1's messages
begin, byte for byte, with request k's, and every request of an epoch carries the same ``tools``
bytes: the server's prompt cache then reuses everything already read (tested by
``tests/engine/test_request.py::test_request_k_plus_1_extends_request_k`` and
``tests/engine/test_turn_fake.py::test_a_tool_loop_replays_byte_for_byte_with_full_reuse``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from loopcommon.jsonbytes import dumps
from loopd.sessionlog.replay import messages_array

# ``id_slot`` for a request the server places itself: the idle slot whose prompt shares most with
# it, restored from the host prompt cache when that slot holds another one
# (docs/production-shape.md, "Choosing the slot").
ANY_SLOT: Final = -1


@dataclass(frozen=True)
class Sampling:
    """Sent in every request: the server's own defaults differ and must never apply."""

    temperature: float = 0.6
    top_p: float = 0.95
    top_k: int = 20
    min_p: float = 0.0


@dataclass(frozen=True)
class RequestSettings:
    """Everything in a chat request that is not the conversation itself."""

    model: str
    slot: int  # sent as ``id_slot``: the session's slot where sessions are pinned, else ANY_SLOT
    max_tokens: int
    sampling: Sampling = Sampling()
    stream: bool = True


def settings_head(settings: RequestSettings) -> str:
    """The fixed fields, in a fixed order, so that every request's head is the same bytes.

    Each request names its slot (or lets the server place it), asks for the prompt cache, sends
    the sampling settings (the server's own defaults differ) and streams with progress and
    per-token timings: the liveness rules and the thinking cap read those
    (``loopd.engine.liveness``, ``loopd.engine.thinkcap``).
    """
    fields = {
        "model": settings.model,
        "id_slot": settings.slot,
        "cache_prompt": True,
        "stream": settings.stream,
        "return_progress": settings.stream,
        "timings_per_token": settings.stream,
        "reasoning_control": settings.stream,
        "max_tokens": settings.max_tokens,
        "temperature": settings.sampling.temperature,
        "top_p": settings.sampling.top_p,
        "top_k": settings.sampling.top_k,
        "min_p": settings.sampling.min_p,
    }
    return dumps(fields)


def build_body(settings: RequestSettings, tools_text: str, messages: Sequence[str]) -> bytes:
    """The request body: fixed fields, the epoch's tools bytes, then the stored messages.

    ``tools_text`` is the exact JSON array text of the epoch ("" or "[]" means no tools, and the
    key is left out, so a model without tool support sees no tools).
    """
    head = settings_head(settings)
    parts = [head[:-1]]
    if tools_text and tools_text != "[]":
        parts.append(',"tools":')
        parts.append(tools_text)
    parts.append(',"messages":')
    parts.append(messages_array(messages))
    parts.append("}")
    return "".join(parts).encode("utf-8")
