"""Pure checks on an assistant message as assembled from the stream.

The stored text is never rewritten; it is parsed only to check its shape at append time and to
read back its tool calls (which of them are unanswered, and what each asked, for a resume).
``tool_calls_of`` is the one reader of a stored message's calls, as the stream assembler's
``ToolCall`` is their one type: the resume, the repeat guard, compaction and the transcript all
read them through it.
"""

import json
from typing import Any

from loopd.wire.assemble import ToolCall


class MalformedAssistantError(ValueError):
    """The text is not an assistant message the log can replay."""


def tool_calls_of(message_text: str) -> tuple[ToolCall, ...]:
    """The tool calls of a serialized assistant message; raises ``MalformedAssistantError``."""
    try:
        message: Any = json.loads(message_text)
    except json.JSONDecodeError as exc:
        raise MalformedAssistantError(f"not JSON ({exc})") from exc
    if not isinstance(message, dict) or message.get("role") != "assistant":
        raise MalformedAssistantError('not a JSON object with "role": "assistant"')
    calls = message.get("tool_calls")
    if calls is None:
        return ()
    if not isinstance(calls, list):
        raise MalformedAssistantError('"tool_calls" is not a list')
    parsed = tuple(_tool_call(call, index) for index, call in enumerate(calls))
    ids = [call.id for call in parsed]
    if len(set(ids)) != len(ids):
        raise MalformedAssistantError(f"tool call ids repeat: {ids}")
    return parsed


def _tool_call(call: Any, index: int) -> ToolCall:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(call, dict) or not isinstance(function, dict):
        raise MalformedAssistantError(f"tool call {index} has no function object")
    call_id, name, arguments = call.get("id"), function.get("name"), function.get("arguments")
    if not isinstance(call_id, str) or not call_id:
        raise MalformedAssistantError(f"tool call {index} has no id")
    if not isinstance(name, str) or not isinstance(arguments, str):
        # Arguments stay the string the stream produced; an object here means someone parsed it.
        raise MalformedAssistantError(f"tool call {call_id}: name and arguments must be strings")
    return ToolCall(call_id, name, arguments)
