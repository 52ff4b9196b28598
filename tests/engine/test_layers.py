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


# The transports docs/design names; every other module of the two packages reads loopd's or
# brokerd's own errors.
TRANSPORTS = {
    "loopd/engine/client.py",
    "loopd/chat/rest.py",
    "loopd/tools/broker_client.py",
    "brokerd/tools/builtins.py",
}


def test_only_the_transports_import_httpx() -> None:
    root = PACKAGE.parent
    importers = set()
    for package in ("loopcommon", "loopd", "brokerd"):
        for path in (root / package).rglob("*.py"):
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                names = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module or ""]
                    if isinstance(node, ast.ImportFrom)
                    else []
                )
                if any(name.split(".")[0] == "httpx" for name in names):
                    importers.add(path.relative_to(root).as_posix())
    proxies = {name for name in importers if name.startswith("brokerd/proxy/")}
    assert importers - proxies == TRANSPORTS
