"""The words hold: every module, path and test name that ``docs/*.md``, the README and the
docstrings of the three packages cite exists.

What is read as a citation: a path under one of the repository's own folders (``loopd/...``,
``tests/...``, ``docs/design``: a ``.md`` may be left off, a test may follow as ``::test_name``);
a module by its full dotted name (``loopd.engine.durable``, or one of its names:
``loopd.chat.threads.passes_on_its_own``); a test's name (``test_...``, in backticks, or anywhere
in a docstring; a test module's name counts as one); in a docstring, a module named from inside
its package (``engine.pinning``). A name too general to check (a placeholder such as
``NAME.json``) or a file's (``loopd.toml``) is not read as one.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("loopcommon", "loopd", "brokerd")
FOLDERS = (*PACKAGES, "tests", "docs", "dev", "bench", "deploy", "scripts", "soak")

# A path: one of the repository's folders at its start (not inside another path, such as
# ``/etc/loopd/expected``), then path characters; what ends a sentence is not part of it.
PATH = re.compile(r"(?<![\w/.~$-])((?:" + "|".join(FOLDERS) + r")/[\w./-]*[\w/])(?:::(test_\w+))?")
MODULE = re.compile(r"(?<![\w./-])((?:" + "|".join(PACKAGES) + r")(?:\.\w+)+)")
TEST_NAME = re.compile(r"(?<![\w./:])(test_[a-z0-9_]+)\b")
BACKTICKED = re.compile(r"`+([^`]+)`+")
# A dotted name that ends so is a file's name (``loopd.toml``, ``brokerd.service``), not a module.
FILE_SUFFIXES = frozenset(
    {"container", "db", "env", "ini", "json", "lock", "log", "md", "py", "service", "sock", "toml"}
)


@functools.cache
def known_tests() -> frozenset[str]:
    """Every test of the repository by name: its functions and its test modules."""
    names = set()
    for path in (ROOT / "tests").rglob("*.py"):
        names.add(path.stem)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                names.add(node.name)
    return frozenset(names)


@functools.cache
def top_names(module: Path) -> frozenset[str]:
    """What a module defines at its top (and in its classes: a method cited as
    ``module.name``)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(module.read_text(encoding="utf-8"))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.ImportFrom):
            names.update(alias.asname or alias.name for alias in node.names)
    return frozenset(names)


def path_problem(cited: str, test: str | None) -> str | None:
    found = ROOT / cited.rstrip("/")
    if not found.exists() and (found.with_suffix(".md")).exists():
        found = found.with_suffix(".md")
    if not found.exists():
        return f"{cited}: no such file or folder"
    if test is not None and found.is_file() and test not in top_names(found):
        return f"{cited}::{test}: no such test in it"
    return None


def module_problem(cited: str) -> str | None:
    """A dotted name: the longest module it begins with, then one of that module's names."""
    parts = cited.split(".")
    for end in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:end])
        module = base.with_suffix(".py") if base.with_suffix(".py").is_file() else None
        if module is None and (base / "__init__.py").is_file():
            module = base / "__init__.py"
        if module is None:
            continue
        rest = parts[end:]
        if not rest or rest[0] in top_names(module):
            return None
        if (base / rest[0]).with_suffix(".py").is_file() or (base / rest[0]).is_dir():
            return None
        return f"{cited}: {'.'.join(parts[:end])} has no {rest[0]}"
    return f"{cited}: no such module"


def citations(text: str, *, backticked_only: bool) -> Iterator[str]:
    """The problems of what ``text`` cites (docs: what is in backticks; docstrings: all)."""
    pieces = BACKTICKED.findall(text) if backticked_only else [text]
    for piece in pieces:
        for match in PATH.finditer(piece):
            if (problem := path_problem(match.group(1), match.group(2))) is not None:
                yield problem
        for match in MODULE.finditer(piece):
            if match.group(1).rsplit(".", 1)[-1] in FILE_SUFFIXES:
                continue
            if (problem := module_problem(match.group(1))) is not None:
                yield problem
        for match in TEST_NAME.finditer(piece):
            if match.group(1) not in known_tests():
                yield f"{match.group(1)}: no such test"


def relative_citations(package: str, text: str) -> Iterator[str]:
    """The problems of the modules a docstring of ``package`` names from inside it, in double
    backticks (``engine.pinning``, ``terminal.render.TurnView``: ``loopd.`` left off)."""
    inside = {
        p.stem if p.suffix == ".py" else p.name
        for p in (ROOT / package).iterdir()
        if p.suffix == ".py" or (p / "__init__.py").is_file()
    }
    for name in re.findall(r"``(\w+(?:\.\w+)+)(?:\(\))?``", text):
        parts = name.split(".")
        if parts[0] not in inside or set(parts) & FILE_SUFFIXES or parts[-1].isdigit():
            continue
        if (problem := module_problem(f"{package}.{name}")) is not None:
            yield problem


def docstrings(path: Path) -> Iterator[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            text = ast.get_docstring(node, clean=False)
            if text:
                yield getattr(node, "lineno", 1), text


DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SOURCES = sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_what_a_doc_cites_exists(doc: Path) -> None:
    problems = sorted(set(citations(doc.read_text(encoding="utf-8"), backticked_only=True)))
    assert not problems, "\n".join(problems)


def test_what_the_docstrings_cite_exists() -> None:
    problems = [
        f"{path.relative_to(ROOT)}:{line}: {problem}"
        for path in SOURCES
        for line, text in docstrings(path)
        for problem in [
            *citations(text, backticked_only=False),
            *relative_citations(path.relative_to(ROOT).parts[0], text),
        ]
    ]
    assert not problems, "\n".join(problems)


def test_a_citation_of_nothing_is_found() -> None:
    # The check itself: each kind of citation, one that holds and one that does not.
    text = (
        "`loopd/engine/durable.py` `loopd/engine/nothing.py` `docs/design` "
        "`loopd.engine.durable.decide_durable` `loopd.engine.durable_io` "
        "`loopd.engine.durable.nothing_here` `test_words_hold` `test_of_nothing` "
        "`tests/test_words.py::test_a_citation_of_nothing_is_found` "
        "`tests/test_words.py::test_nowhere` /etc/loopd/expected"
    )
    assert list(relative_citations("loopd", "``engine.pinning`` ``terminal.StatusLine``")) == [
        "loopd.terminal.StatusLine: loopd.terminal has no StatusLine"
    ]
    assert sorted(citations(text, backticked_only=True)) == [
        "loopd.engine.durable.nothing_here: loopd.engine.durable has no nothing_here",
        "loopd.engine.durable_io: loopd.engine has no durable_io",
        "loopd/engine/nothing.py: no such file or folder",
        "test_of_nothing: no such test",
        "tests/test_words.py::test_nowhere: no such test in it",
    ]


def test_words_hold() -> None:
    """A name the check above cites as one that exists."""
    assert known_tests()
