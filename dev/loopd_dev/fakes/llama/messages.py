"""Chat request parsing: a ``/v1/chat/completions`` body into typed values, with the real errors.

The real server answers client mistakes with 400 (``std::invalid_argument``) or, for anything wrong
inside ``messages[]``, 500 ``Failed to parse messages: ...``; the same split is kept here so clients
learn to tell them apart.
"""

import json
from dataclasses import dataclass, field
from typing import Any

from loopcommon.jsonbytes import dumps

from .errors import invalid_request, server_error

_ROLES = ("system", "developer", "user", "assistant", "tool")
_TOOL_CHOICES = ("auto", "none", "required")


@dataclass(frozen=True)
class ToolCallText:
    """An assistant tool call as the template sees it: ``arguments`` is the exact string."""

    name: str
    arguments: str
    id: str = ""


@dataclass(frozen=True)
class Message:
    role: str
    content: str = ""
    reasoning: str = ""
    tool_calls: tuple[ToolCallText, ...] = ()


@dataclass(frozen=True)
class ChatRequest:
    """The fields of a chat request that change what the fake does."""

    messages: tuple[Message, ...]
    tools: tuple[Any, ...] = ()
    model: str | None = None
    stream: bool = False
    include_usage: bool = False
    id_slot: int = -1
    cache_prompt: bool = True
    return_progress: bool = False
    timings_per_token: bool = False
    sse_ping_interval: int | None = None
    reasoning_control: bool = False
    reasoning_budget_message: str = ""
    ignore_eos: bool = False
    n_predict: int = -1
    params: dict[str, Any] = field(default_factory=dict)


def parse_json_body(raw: bytes) -> Any:
    """The request body as JSON, or the 400 the real server gives for a parse error."""
    try:
        return json.loads(raw) if raw.strip() else {}
    except ValueError as exc:
        raise invalid_request(f"[json.exception.parse_error.101] parse error: {exc}") from exc


def parse_chat_request(body: Any) -> ChatRequest:
    """Validate a chat body; raises :class:`ApiError` with the real status and wording."""
    if not isinstance(body, dict):
        raise invalid_request("[json.exception.type_error.302] type must be object")
    if "messages" not in body:
        raise invalid_request("'messages' is required")
    raw_messages = body["messages"]
    if not isinstance(raw_messages, list):
        raise invalid_request("Expected 'messages' to be an array")
    tool_choice = body.get("tool_choice", "auto")
    if isinstance(tool_choice, str) and tool_choice not in _TOOL_CHOICES:
        raise invalid_request(f"Invalid tool_choice: {tool_choice}")
    messages = tuple(_parse_message(m) for m in raw_messages)
    _check_trailing_assistant(messages)
    return ChatRequest(
        messages=messages,
        tools=_parse_tools(body.get("tools")),
        model=body.get("model") if isinstance(body.get("model"), str) else None,
        stream=_bool(body, "stream", False),
        include_usage=_include_usage(body),
        id_slot=body["id_slot"] if _is_int(body.get("id_slot")) else -1,
        cache_prompt=_bool(body, "cache_prompt", True),
        return_progress=_bool(body, "return_progress", False),
        timings_per_token=_bool(body, "timings_per_token", False),
        sse_ping_interval=_int_field(body, "sse_ping_interval", -1),
        reasoning_control=_bool(body, "reasoning_control", False),
        reasoning_budget_message=_str_field(body, "reasoning_budget_message"),
        ignore_eos=_bool(body, "ignore_eos", False),
        n_predict=_n_predict(body),
        params={
            k: body[k] for k in ("temperature", "top_k", "top_p", "min_p", "seed") if k in body
        },
    )


def _parse_message(raw: Any) -> Message:
    if not isinstance(raw, dict):
        raise server_error("Failed to parse messages: message must be an object")
    role = raw.get("role")
    if not isinstance(role, str):
        raise server_error(f"Failed to parse messages: Missing 'role' in message: {dumps(raw)}")
    if role not in _ROLES:
        raise server_error(f"Failed to parse messages: Unsupported role: {role}")
    if role == "developer":
        role = "system"
    has_calls = bool(raw.get("tool_calls"))
    if "content" not in raw and not (role == "assistant" and has_calls):
        what = "'content' or 'tool_calls'" if role == "assistant" else "'content'"
        raise invalid_request(f"Expected {what}")
    reasoning = raw.get("reasoning_content", "")
    if not isinstance(reasoning, str):
        raise server_error(
            "Failed to parse messages: [json.exception.type_error.302] type must be string, "
            f"but is {_json_type(reasoning)}"
        )
    return Message(
        role=role,
        content=_content_text(raw.get("content")),
        reasoning=reasoning,
        tool_calls=tuple(_parse_tool_call(c) for c in raw.get("tool_calls") or ()),
    )


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise server_error("Failed to parse messages: Invalid 'content' type")
    texts: list[str] = []
    for part in content:
        if not isinstance(part, dict) or part.get("type") != "text":
            kind = part.get("type") if isinstance(part, dict) else part
            if kind in ("image_url", "input_audio", "input_video", "video_url"):
                raise server_error(
                    "image input is not supported - hint: if this is unexpected, "
                    "you may need to provide the mmproj"
                )
            raise invalid_request(f"unsupported content[].type: {kind}")
        texts.append(str(part.get("text", "")))
    return "".join(texts)


def _parse_tool_call(raw: Any) -> ToolCallText:
    function = raw.get("function") if isinstance(raw, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise server_error("Failed to parse messages: Missing tool call function name")
    arguments = function.get("arguments", "")
    if not isinstance(arguments, str):
        arguments = dumps(arguments)
    try:
        json.loads(arguments)
    except ValueError as exc:
        # The template consumes object arguments, so the string is re-parsed before rendering.
        raise server_error(f"Failed to parse tool call arguments as JSON: {exc}") from exc
    call_id = raw.get("id")
    return ToolCallText(function["name"], arguments, call_id if isinstance(call_id, str) else "")


def _parse_tools(raw: Any) -> tuple[Any, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise server_error("Failed to parse tools: Expected 'tools' to be an array")
    for tool in raw:
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise server_error(f"Failed to parse tools: Missing tool function name: {dumps(tool)}")
    return tuple(raw)


def _check_trailing_assistant(messages: tuple[Message, ...]) -> None:
    if len(messages) >= 2 and messages[-1].role == messages[-2].role == "assistant":
        raise invalid_request("Cannot have 2 or more assistant messages at the end of the list.")
    if messages and messages[-1].role == "assistant" and messages[-1].tool_calls:
        raise invalid_request("Cannot continue an assistant message that has tool calls")


def _n_predict(body: dict[str, Any]) -> int:
    for key in ("n_predict", "max_completion_tokens", "max_tokens"):
        if body.get(key) is not None:
            value = _int_field(body, key, -1)
            if value < -1:
                raise invalid_request(f"Field '{key}': Value must be between -1 and 2147483647")
            return value
    return -1


def _include_usage(body: dict[str, Any]) -> bool:
    options = body.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


def _bool(body: dict[str, Any], key: str, default: bool) -> bool:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise invalid_request(f"Field '{key}': type must be boolean, but is {_json_type(value)}")
    return value


def _int_field(body: dict[str, Any], key: str, default: int) -> int:
    value = body.get(key)
    if value is None:
        return default
    if not _is_int(value):
        raise invalid_request(f"Field '{key}': type must be number, but is {_json_type(value)}")
    return int(value)


def _str_field(body: dict[str, Any], key: str) -> str:
    value = body.get(key)
    return value if isinstance(value, str) else ""


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _json_type(value: Any) -> str:
    names = {type(None): "null", bool: "boolean", str: "string", list: "array", dict: "object"}
    return names.get(type(value), "number")
