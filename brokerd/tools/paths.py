"""Host paths in a tool's arguments: each must lie under a folder brokerd's config allows (pure).

The check is lexical (the path normalised, never looked up on the host), so its answer is the
same whether or not the path exists: a refusal tells the model nothing about the host. Symbolic
links are resolved later, inside the sandbox, which shows only the allowed folder holding the
path: a link that leads out of it leads nowhere.
"""

import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class PlacedPaths:
    """The arguments with each path normalised, and the allowed folders that hold them."""

    arguments: dict[str, Any]
    roots: tuple[Path, ...]


def place_paths(
    names: Sequence[str], arguments: Mapping[str, Any], roots: Sequence[Path]
) -> PlacedPaths | str:
    """Check the path arguments ``names``; the result, or why the call is refused."""
    placed = dict(arguments)
    used: list[Path] = []
    for name in names:
        if name not in arguments:
            continue  # an optional path left out: the schema allowed it
        value = arguments[name]
        allowed = ", ".join(str(root) for root in roots)
        if not roots:
            return f"{name}: brokerd allows this tool no host folder (host_path_roots is empty)"
        if not isinstance(value, str) or not value.startswith("/"):
            return f"{name} must be an absolute path under {allowed}"
        path = Path(posixpath.normpath(value))
        root = next((root for root in roots if path == root or root in path.parents), None)
        if root is None:
            return f"{name} must be a path under {allowed}"
        placed[name] = str(path)
        if root not in used:
            used.append(root)
    return PlacedPaths(placed, tuple(used))
