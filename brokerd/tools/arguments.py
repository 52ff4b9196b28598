"""Turning the model's argument text into a checked object: pure, and every problem is worded
so the model can fix its call (the JSON error, or each schema error's path and message)."""

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from jsonschema.exceptions import relevance

from loopcommon.schemas import validator

MAX_PROBLEMS = 5
MAX_MESSAGE_CHARS = 300
MAX_DEPTH = 32  # levels of nesting in a tool's arguments


@dataclass(frozen=True)
class ArgumentProblems:
    """Why the arguments were refused: one headline and the details the model needs."""

    headline: str
    details: tuple[str, ...] = ()


def parse_arguments(text: str) -> dict[str, Any] | ArgumentProblems:
    """Parse the model's argument string; blank text means "no arguments" (``{}``)."""
    if not text.strip():
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        return ArgumentProblems(
            "are not valid JSON", (f"{exc.msg} at line {exc.lineno} column {exc.colno}",)
        )
    except RecursionError:
        return _too_deep()
    return object_or_problem(value)


def object_or_problem(value: object) -> dict[str, Any] | ArgumentProblems:
    """Arguments must be a JSON object, nested at most ``MAX_DEPTH`` levels; anything else is
    named by its JSON type."""
    if not isinstance(value, dict):
        return ArgumentProblems(f"must be a JSON object, not {_json_type(value)}")
    if nests_deeper(value, MAX_DEPTH):
        return _too_deep()
    return value


def nests_deeper(value: object, limit: int) -> bool:
    """Whether arrays and objects in ``value`` nest more than ``limit`` levels (no recursion,
    so any depth is safe to ask about)."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children: Iterable[object]
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def _too_deep() -> ArgumentProblems:
    return ArgumentProblems(f"nest deeper than {MAX_DEPTH} levels")


def schema_problems(
    schema: Mapping[str, Any], arguments: Mapping[str, Any]
) -> ArgumentProblems | None:
    """Check ``arguments`` against the tool's schema; ``None`` when they conform."""
    # The schema's own "$schema" decides its draft (an MCP server's are often draft-07); its
    # patterns match in linear time.
    errors = sorted(validator(schema).iter_errors(arguments), key=relevance, reverse=True)
    if not errors:
        return None
    details = [f"at {json_path(error.absolute_path)}: {_clip(error.message)}" for error in errors]
    if len(details) > MAX_PROBLEMS:
        details = [*details[:MAX_PROBLEMS], f"... and {len(details) - MAX_PROBLEMS} more"]
    return ArgumentProblems("do not match the tool's schema", tuple(details))


def json_path(parts: Iterable[str | int]) -> str:
    """``arguments.headers["X-Key"][0]``-style path of a value inside the arguments."""
    path = "arguments"
    for part in parts:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part.isidentifier():
            path += f".{part}"
        else:
            path += f"[{json.dumps(part, ensure_ascii=False)}]"
    return path


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return type(value).__name__


def _clip(message: str) -> str:
    # A schema error repeats the offending value, which may be megabytes of model output.
    if len(message) <= MAX_MESSAGE_CHARS:
        return message
    return message[:MAX_MESSAGE_CHARS] + "..."
