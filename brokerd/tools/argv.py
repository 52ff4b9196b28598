"""Placing checked arguments into a command's argv template (pure).

Each ``{name}`` in a template element is replaced by that argument's value (or its schema
default). The command is run without a shell, so a value can never become a second command; the
one remaining trick, a value that a program would read as an option (``--output=/etc/x``), is
refused here.
"""

from collections.abc import Mapping, Sequence
from typing import Any

from brokerd.tools.catalogue import PLACEHOLDER
from brokerd.tools.errors import ArgvError


def build_argv(
    template: Sequence[str], arguments: Mapping[str, Any], parameters: Mapping[str, Any]
) -> tuple[str, ...]:
    properties: Mapping[str, Any] = parameters.get("properties", {})

    def value_of(name: str) -> str:
        if name in arguments:
            value = arguments[name]
        elif isinstance(properties.get(name), dict) and "default" in properties[name]:
            value = properties[name]["default"]
        else:
            raise ArgvError(f"argument {name!r} is needed and has no default")
        return _as_argument(name, value)

    return tuple(PLACEHOLDER.sub(lambda match: value_of(match.group(1)), part) for part in template)


def _as_argument(name: str, value: object) -> str:
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, int | float | str):
        text = str(value)
    else:
        raise ArgvError(f"argument {name!r} must be a string or a number to go on a command line")
    if text.startswith("-"):
        raise ArgvError(f"argument {name!r} must not start with '-' (it would read as an option)")
    if "\x00" in text:
        raise ArgvError(f"argument {name!r} must not contain a NUL character")
    return text
