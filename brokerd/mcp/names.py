"""An MCP tool's name in the catalogue: ``<server>.<tool part>`` (pure).

MCP allows tool names the catalogue's text cannot hold safely (upper case, dots, any character
a careless server sends), and the model copies the name into ``call_tool``. The tool part keeps
the characters ``a-z 0-9 _ -`` and is the MCP name itself whenever that is all it holds, so
``get_current_time`` and ``get-sum`` read as they are. Any other name is written as a readable
base (upper case lowered, other characters as ``_``) then ``__`` then what was replaced, as
``<position>h<hex code point>`` items joined by ``_``: ``getSum`` is ``getsum__3h53``.

The mapping is injective and stable: it depends on the name alone, and ``original`` inverts it.
A kept name never contains ``__`` (one that does is written the long way, with nothing
replaced: ``a__b`` is ``a__b__``), so the last ``__`` of a written name always starts its list.
"""

import re
from typing import Final

KEPT: Final = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_-")
MARK: Final = "__"
# The MCP specification asks for names of 1 to 128 characters; longer ones are not offered.
MAX_MCP_NAME_CHARS: Final = 128
_ITEM = re.compile(r"([0-9]+)h([0-9a-f]+)")


def tool_part(mcp_name: str) -> str:
    """The catalogue's form of an MCP tool name (``ValueError`` for an empty or overlong one)."""
    if not 0 < len(mcp_name) <= MAX_MCP_NAME_CHARS:
        raise ValueError(f"an MCP tool name has 1 to {MAX_MCP_NAME_CHARS} characters")
    if set(mcp_name) <= KEPT and MARK not in mcp_name:
        return mcp_name
    base: list[str] = []
    replaced: list[str] = []
    for position, char in enumerate(mcp_name):
        if char in KEPT:
            base.append(char)
            continue
        lowered = char.lower()
        base.append(lowered if lowered in KEPT and char.isascii() else "_")
        replaced.append(f"{position}h{ord(char):x}")
    return "".join(base) + MARK + "_".join(replaced)


def original(part: str) -> str:
    """The MCP name that ``tool_part`` wrote as ``part`` (``ValueError`` if it wrote no such)."""
    if MARK not in part:
        return part
    base, _, listed = part.rpartition(MARK)
    chars = list(base)
    for item in listed.split("_") if listed else []:
        match = _ITEM.fullmatch(item)
        if match is None or int(match.group(1)) >= len(chars):
            raise ValueError(f"{part!r} is not a written MCP tool name")
        chars[int(match.group(1))] = chr(int(match.group(2), 16))
    return "".join(chars)


def catalogue_name(server: str, mcp_name: str) -> str:
    return f"{server}.{tool_part(mcp_name)}"
