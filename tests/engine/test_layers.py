"""The layers, read from the source: every module that says it is pure is, and httpx stays inside
the transports."""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Collection
from pathlib import Path

import pytest

import loopd

PACKAGE = Path(loopd.__file__).parent
PURE_POLICIES = ["engine/liveness.py", "engine/thinkcap.py"]
# What a policy may import: the standard library's data types and loopd's own error tree.
PURE_IMPORTS = {"__future__", "collections.abc", "dataclasses", "typing", "loopd.errors"}
ABOVE_THE_TRANSPORT = ["engine/stream.py", "turn/loop.py", "sessions.py"]


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
    "loopcommon/transport.py",
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


# -- Purity, checked for every module that claims it ------------------------------------------
#
# A module's docstring that says "pure" or "no I/O" is a claim about the whole module, unless
# the module is listed in PURE_PARTS with the names of its pure functions and classes (a pure
# core beside its thin I/O shell in one file), or in MENTIONS_ONLY (the docstring speaks of other
# modules' purity: a package's layout, a shell naming its core). A pure module imports, when it
# runs, no module that does I/O (IO_ROOTS) and none of the project's modules but pure ones, so it
# cannot reach httpx or anyio through a type it borrows. A pure part of a mixed module uses none
# of its module's I/O imports and calls none of its module's other functions.

IO_ROOTS = frozenset(
    {
        "anyio",
        "asyncio",
        "httpx",
        "logging",
        "mcp",
        "os",
        "select",
        "shutil",
        "signal",
        "socket",
        "sqlite3",
        "starlette",
        "subprocess",
        "tempfile",
        "time",
        "uvicorn",
        "websockets",
    }
)
CLAIM = re.compile(r"\bpure\b|\bno I/O\b", re.IGNORECASE)
PURE_PARTS: dict[str, set[str]] = {
    "brokerd.confine": {"check_declared", "confined_argv"},
    "brokerd.proxy.chatpolicy": {"valid_entry", "direct_members", "channel_refusal"},
    "brokerd.proxy.slotfolder": {"SavedFile", "evictions"},
    "brokerd.tools.builtins": {"host_allowed", "url_problem", "is_text"},
    "loopcommon.sandbox": {
        "ResourceLimits",
        "HiddenPath",
        "Bind",
        "Confinement",
        "Mount",
        "HostView",
        "is_within",
        "masks",
        "mask_argv",
        "sandbox_argv",
        "probe_failure",
    },
    "loopd.contextwindow.budget": {
        "BudgetRules",
        "BudgetVerdict",
        "judge",
        "upper_bound_tokens",
        "estimate_prompt",
        "input_cap",
        "Cut",
        "cut_note",
        "cut_text",
        "context_share",
    },
    "loopd.endpoints.server": {"Known", "known"},
    "loopd.contextwindow.pool": {
        "_count",
        "held_by_busy_slots",
        "fits_beside",
        "all_idle",
    },
    "loopd.sessionlog.verify": {
        "Problem",
        "check_session",
        "check_chain",
        "check_messages",
        "_role_of",
        "check_epochs",
        "check_requests",
        "_check_replay_identity",
    },
    "loopd.tools.files": {
        "apply_edit",
        "render_window",
        "render_listing",
        "_entry_line",
        "compile_regex",
        "line_matcher",
        "_count",
        "shorten",
    },
    "loopd.tools.workspace": {"check_relative", "confine", "describe_size"},
    "loopd.transcript": {
        "markdown",
        "_entry_markdown",
        "_assistant_markdown",
        "_message",
        "_quote",
        "_fenced",
    },
}
# Modules whose import does no I/O though they import a module that can: what they define is
# read by pure code as values.
DECLARATIONS: dict[str, str] = {
    "loopd.config": "the settings model and its defaults; only load_settings reads a source",
}
MENTIONS_ONLY: dict[str, str] = {
    "brokerd.tools.service": "the shell around the pure ranking, calls and wording",
    "loopd.endpoints.serving": "the I/O shell around Fleet (placement and health)",
    "loopd.endpoints.warm": "the shell around the pure prewarm plan",
    "loopd.status.page": "reads the runtime; loopcommon.statuspage renders",
    "loopd.selftest": "the package: pure checks beside the probe",
}


def _source(module: str) -> ast.Module:
    return ast.parse(_path(module).read_text())


def _path(module: str) -> Path:
    base = PACKAGE.parent / module.replace(".", "/")
    return base.with_suffix(".py") if base.with_suffix(".py").exists() else base / "__init__.py"


def project_modules() -> list[str]:
    root = PACKAGE.parent
    found = []
    for package in ("loopcommon", "loopd", "brokerd"):
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            found.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return found


def claims_purity(module: str) -> bool:
    return bool(CLAIM.search(ast.get_docstring(_source(module)) or ""))


def runtime_imports(module: str, known: Collection[str]) -> set[str]:
    """What ``module`` imports when it runs (``if TYPE_CHECKING:`` blocks left out): foreign
    roots as they are, the project's modules by their full names."""
    tree = _source(module)
    typing_only = {
        id(node)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
        for stmt in block.body
        for node in ast.walk(stmt)
    }
    names: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                names.add(sub if sub in known else node.module)
    return names


def _io_of(names: set[str]) -> set[str]:
    return {name for name in names if name.split(".")[0] in IO_ROOTS}


def io_reached(known: Collection[str]) -> dict[str, set[str]]:
    """For each of the project's modules, the I/O modules it reaches when it runs: its own
    imports of them and those of every project module it imports, all the way down."""
    imports = {m: runtime_imports(m, known) for m in known}
    reached = {m: set() if m in DECLARATIONS else _io_of(imports[m]) for m in known}
    changed = True
    while changed:  # to a fixed point: cycles are the architecture test's to refuse
        changed = False
        for module in set(known) - set(DECLARATIONS):
            for name in imports[module] & set(known):
                if not reached[name] <= reached[module]:
                    reached[module] |= reached[name]
                    changed = True
    return reached


@functools.cache
def _reached() -> dict[str, set[str]]:
    return io_reached(project_modules())


def purity_problems(module: str) -> list[str]:
    """What is wrong with ``module``'s claim of purity (nothing, when it holds)."""
    known = project_modules()
    reached = _reached()
    if module in MENTIONS_ONLY:
        return []
    if module in PURE_PARTS:
        io_free = {m for m in known if not reached[m]}
        return impure_parts(module, PURE_PARTS[module], known, io_free)
    imports = runtime_imports(module, known)
    own = sorted(_io_of(imports))
    through = sorted(name for name in imports & set(known) if reached[name])
    if not own and not through:
        return []
    return [
        f"{module} says it is pure but imports {', '.join(own + through)}"
        f" (I/O reached: {', '.join(sorted(reached[module]))})"
    ]


def impure_parts(module: str, parts: set[str], known: Collection[str], pure: set[str]) -> list[str]:
    tree = _source(module)
    io_names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            source = node.module if isinstance(node, ast.ImportFrom) else None
            for alias in node.names:
                origin = source or alias.name
                full = f"{origin}.{alias.name}" if source else origin
                borrowed_pure = alias.name in PURE_PARTS.get(origin, set())
                if origin.split(".")[0] in IO_ROOTS or (
                    full.split(".")[0] in ("loopd", "brokerd", "loopcommon")
                    and (full if full in known else origin) not in pure
                    and not origin.endswith("errors")
                    and not borrowed_pure
                ):
                    io_names.add((alias.asname or alias.name).split(".")[0])
    defs = {
        node.name: node
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
    }
    problems = []
    for name in sorted(parts):
        if name not in defs:
            problems.append(f"{name} is listed as pure but not defined")
            continue
        nodes = _body_nodes(defs[name])
        local = {n.id for n in nodes if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        local |= {n.arg for n in nodes if isinstance(n, ast.arg)}
        used = {n.id for n in nodes if isinstance(n, ast.Name)} - local
        problems += [f"{name} (pure) uses {n}" for n in sorted(used & io_names)]
        problems += [
            f"{name} (pure) calls {n}, which is not listed as pure"
            for n in sorted(used & set(defs) - parts - {name})
            if not isinstance(defs[n], ast.ClassDef)
        ]
        if isinstance(defs[name], ast.AsyncFunctionDef):
            problems.append(f"{name} (pure) is a coroutine")
    return problems


def _body_nodes(definition: ast.AST) -> list[ast.AST]:
    """What a definition runs: its nodes but its annotations (a type named in a signature, such
    as ``httpx.URL``, is a value the caller passes, not I/O the function does)."""
    annotations = {
        id(node)
        for inner in ast.walk(definition)
        for annotation in _annotations(inner)
        for node in ast.walk(annotation)
    }
    return [node for node in ast.walk(definition) if id(node) not in annotations]


def _annotations(node: ast.AST) -> list[ast.AST]:
    if isinstance(node, ast.arg) and node.annotation is not None:
        return [node.annotation]
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.returns is not None:
        return [node.returns]
    if isinstance(node, ast.AnnAssign):
        return [node.annotation]
    return []


CLAIMED = [m for m in project_modules() if claims_purity(m)]


def test_the_claims_are_read() -> None:
    assert len(CLAIMED) > 40  # the project has dozens of pure modules, and says so
    assert set(PURE_PARTS) | set(MENTIONS_ONLY) <= set(CLAIMED), "a listed module makes no claim"


@pytest.mark.parametrize("module", CLAIMED)
def test_a_module_that_says_it_is_pure_is(module: str) -> None:
    problems = purity_problems(module)
    assert not problems, "\n".join(problems)


# -- One request recorder --------------------------------------------------------------------

RECORDER = "loopd/observe/recorder.py"


def _calls(path: Path) -> set[str]:
    """What ``path`` calls, by name or attribute (``RequestRecord(``, ``log.record_request(``)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name):
                names.add(func.id)
            elif isinstance(func, ast.Attribute):
                names.add(func.attr)
    return names


def test_one_module_builds_and_appends_a_requests_record() -> None:
    # The session log stores records; everyone else goes through the recorder.
    builders = {
        path.relative_to(PACKAGE.parent).as_posix()
        for path in PACKAGE.rglob("*.py")
        if "sessionlog" not in path.parts
        and _calls(path) & {"RequestRecord", "record_request", "append_assistant"}
    }
    assert builders == {RECORDER}
