"""The engine's layers, read from its source: the policies import nothing that does I/O, and httpx
stays inside the transports."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import loopd

PACKAGE = Path(loopd.__file__).parent
PURE_POLICIES = ["engine/liveness.py", "engine/thinkcap.py"]
# What a policy may import: the standard library's data types and loopd's own error tree.
PURE_IMPORTS = {"__future__", "collections.abc", "dataclasses", "typing", "loopd.errors"}
ABOVE_THE_TRANSPORT = ["engine/stream.py", "engine/turn.py", "sessions.py"]


def imported(module: str) -> set[str]:
    tree = ast.parse((PACKAGE / module).read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("module", PURE_POLICIES)
def test_a_policy_imports_nothing_that_does_io(module: str) -> None:
    assert imported(module) <= PURE_IMPORTS, imported(module) - PURE_IMPORTS


@pytest.mark.parametrize("module", ABOVE_THE_TRANSPORT)
def test_nothing_above_the_transport_sees_httpx(module: str) -> None:
    assert not {name for name in imported(module) if name.split(".")[0] == "httpx"}
