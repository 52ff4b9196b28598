"""The architecture, read from the source: which package may import which, and no import cycles.

brokerd runs on the host and loopd in the box: what they share is the ``loopcommon`` package, so
brokerd imports nothing of loopd, and ``loopcommon`` imports neither daemon. Within the three
packages, the modules' imports form no cycle: a cycle means two modules are one concept split in
two files, or a shared type kept inside an I/O module. Imports inside ``if TYPE_CHECKING:`` count
too (they are still a dependency of the reader's). And the command line answers ``--version`` and
``--help`` without importing what the daemons need (``loopd.cli.parser``).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections.abc import Collection, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("loopcommon", "loopd", "brokerd")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for package in PACKAGES for p in (ROOT / package).rglob("*.py")}


def imported_names(path: Path, known: Collection[str] = ()) -> Iterator[str]:
    """Every module name ``path`` imports: ``from X import y`` is ``X.y`` when that is one of
    the ``known`` modules (a submodule), else ``X``."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                yield submodule if submodule in known else node.module


def import_graph() -> dict[str, set[str]]:
    known = modules()
    return {
        name: {t for t in imported_names(path, known) if t in known and t != name}
        for name, path in known.items()
    }


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_graph_is_read() -> None:
    graph = import_graph()
    assert "loopcommon.context" in graph["loopd.requestscope"]
    assert "loopcommon.context" in graph["brokerd.observe.context"]


@pytest.mark.parametrize(
    ("package", "forbidden"), [("brokerd", {"loopd"}), ("loopcommon", {"loopd", "brokerd"})]
)
def test_a_package_imports_only_what_it_may(package: str, forbidden: set[str]) -> None:
    offending = sorted(
        f"{module_name(path)} imports {target}"
        for path in (ROOT / package).rglob("*.py")
        for target in imported_names(path)
        if target.split(".")[0] in forbidden
    )
    assert not offending, "\n".join(offending)


def test_the_modules_import_no_cycle() -> None:
    found = cycles(import_graph())
    assert not found, "\n".join(" <-> ".join(component) for component in found)


def test_a_cycle_is_found() -> None:
    # The check itself: a graph with a cycle of three and a tail.
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]


# -- loopd's layers ------------------------------------------------------------------------------
#
# loopd's units are its packages and top-level modules (``loopd.engine``, ``loopd.sessions``); the
# layers list them top first, and a unit imports only units of the layers below its own. The same
# order is written in docs/design.md ("Layers"), and kept equal to this one.

LAYERS: tuple[tuple[str, ...], ...] = (
    ("cli", "__main__"),
    ("serve",),
    ("status",),
    ("usage",),
    ("terminal",),
    ("chat",),
    ("sessions",),
    ("endpoints", "serverchange"),
    ("selftest",),
    ("config",),
    ("turn",),
    ("contextwindow", "prewarm"),
    ("observe", "approvals", "logviews"),
    ("engine", "tools"),
    (
        "transcript",
        "turnstop",
        "scheduler",
        "requestscope",
        "statedir",
        "chatsettings",
        "datafiles",
    ),
    ("sessionlog",),
    ("wire",),
    ("errors",),
)


def unit(module: str) -> str | None:
    """The loopd unit a module belongs to (None: not loopd's, or the package itself)."""
    parts = module.split(".")
    return parts[1] if parts[0] == "loopd" and len(parts) > 1 else None


def back_arrows(
    graph: dict[str, set[str]], layers: tuple[tuple[str, ...], ...] = LAYERS
) -> list[str]:
    """Every import of a loopd module by one of a unit in its own layer or a lower one, as
    ``importer -> imported (layer a -> layer b)``; an import within a unit is not one."""
    layer = {name: depth for depth, names in enumerate(layers) for name in names}
    found = []
    for importer, targets in graph.items():
        source = unit(importer)
        for target in targets:
            dest = unit(target)
            if source is None or dest is None or source == dest:
                continue
            if layer[dest] <= layer[source]:
                found.append(
                    f"{importer} -> {target} (layer {layer[source] + 1} -> {layer[dest] + 1})"
                )
    return sorted(found)


def test_every_unit_of_loopd_has_a_layer() -> None:
    units = {unit(name) for name in modules()} - {None}
    layered = [name for names in LAYERS for name in names]
    assert len(layered) == len(set(layered)), "a unit is in two layers"
    assert units == set(layered)


def test_loopds_layers_hold() -> None:
    found = back_arrows(import_graph())
    assert not found, "\n".join(found)


def test_a_back_arrow_is_found() -> None:
    # The check itself, on loopd's own graph with an arrow planted back up the layers (the
    # engine importing the status page it is read by), and one across a layer.
    graph = {name: set(targets) for name, targets in import_graph().items()}
    assert back_arrows(graph) == []
    graph["loopd.engine.client"].add("loopd.status.page")
    graph["loopd.prewarm.plan"].add("loopd.contextwindow.budget")
    assert back_arrows(graph) == [
        "loopd.engine.client -> loopd.status.page (layer 14 -> 3)",
        "loopd.prewarm.plan -> loopd.contextwindow.budget (layer 12 -> 12)",
    ]


def test_the_layers_are_the_ones_docs_design_writes() -> None:
    text = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    section = text.split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    written = tuple(
        tuple(re.findall(r"`([\w_]+)`", line.split(":", 1)[0]))
        for line in section.splitlines()
        if re.match(r"\d+\. `", line)
    )
    assert written == LAYERS


# -- package re-exports --------------------------------------------------------------------------


def test_what_a_package_re_exports_is_imported_from_it() -> None:
    """A name a package's ``__init__`` lists in ``__all__`` is imported from the package
    somewhere (the code, the tests, the benchmarks, the development kit): else it goes."""
    imported: dict[str, set[str]] = {}
    for folder in (*PACKAGES, "tests", "bench", "dev", "soak"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    imported.setdefault(node.module, set()).update(a.name for a in node.names)
    unused = []
    for package in PACKAGES:
        for init in (ROOT / package).rglob("__init__.py"):
            listed = [
                element.value
                for node in ast.parse(init.read_text()).body
                if isinstance(node, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)
                and isinstance(node.value, ast.List | ast.Tuple)
                for element in node.value.elts
                if isinstance(element, ast.Constant) and isinstance(element.value, str)
            ]
            name = module_name(init)
            unused += [f"{name}.{x}" for x in listed if x not in imported.get(name, set())]
    assert not unused, "\n".join(sorted(unused))


# What the daemons need and a command line answering ``--version`` or ``--help`` does not: each
# costs tens to hundreds of milliseconds to import (``make bench``'s start-up section).
HEAVY_DEPENDENCIES = frozenset(
    {
        "httpx",
        "httpcore",
        "anyio",
        "pydantic",
        "pydantic_core",
        "pydantic_settings",
        "uvicorn",
        "starlette",
        "websockets",
        "prometheus_client",
        "sqlite_utils",
        "jsonschema",
        "rich",
        "mcp",
        "shtab",
    }
)


def imported_modules(*argv: str) -> set[str]:
    """Every module the interpreter imports running ``python -X importtime ARGV``."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    lines = result.stderr.splitlines()
    return {line.rsplit("|", 1)[1].strip() for line in lines if line.startswith("import time:")}


@pytest.mark.parametrize(
    "argv",
    [
        ("-c", "import loopd, loopd.cli.main"),
        ("-m", "loopd", "--version"),
        ("-m", "loopd", "--help"),
    ],
)
def test_the_command_line_answers_without_the_heavy_dependencies(argv: tuple[str, ...]) -> None:
    loaded = {name.split(".")[0] for name in imported_modules(*argv)}
    assert "argparse" in loaded  # the check itself: the import list was read
    assert not loaded & HEAVY_DEPENDENCIES, sorted(loaded & HEAVY_DEPENDENCIES)


def test_a_command_imports_what_it_runs() -> None:
    # The check's other side: ``loopd config`` loads the settings (pydantic), ``sessions`` the log.
    loaded = {name.split(".")[0] for name in imported_modules("-m", "loopd", "config")}
    assert "pydantic" in loaded
