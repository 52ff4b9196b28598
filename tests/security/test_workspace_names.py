"""Attacks on the session-to-workspace mapping, driven through ``loopd tools call``.

Each test is one row of docs/security.md's table: its docstring gives the attack (first line),
the input and what is expected; ``record_property("observed", ...)`` says what the run saw.
"""

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.tools.toolcall import LoopdBox

Record = Callable[[str, object], None]


@pytest.fixture
def box(tmp_path: Path) -> LoopdBox:
    return LoopdBox(tmp_path)


def test_two_sessions_whose_names_differ_in_punctuation_do_not_share_files(
    box: LoopdBox, record_property: Record
) -> None:
    """A session reads another's workspace through a colliding name (mm:abc and mm_abc).

    Input: write_file secret.txt as session mm:abc, then read_file secret.txt as mm_abc
    Expected: not found: each name has its own folder
    """
    box.add_sessions("mm:abc", "mm_abc")
    wrote = box.call("write_file", "mm:abc", {"path": "secret.txt", "content": "mm:abc only"})
    assert wrote.returncode == 0
    read = box.call("read_file", "mm_abc", {"path": "secret.txt"})
    record_property("observed", f"exit {read.returncode}: {read.stdout.strip()}")
    assert (read.returncode, read.stdout) == (1, "secret.txt: no such file or directory\n")
    assert sorted(p.name for p in box.workspaces.iterdir() if p.is_dir()) == [
        "mm%3Aabc",
        "mm_abc",
    ]


@pytest.mark.parametrize("name", [".", ".."], ids=["dot", "dotdot"])
def test_a_session_named_dot_cannot_read_every_workspace(
    box: LoopdBox, record_property: Record, name: str
) -> None:
    """A session named '.' (the workspaces root) or '..' (above it) reads every workspace.

    Input: list_dir victim as session '.' (or '..'), beside a session victim with a file
    Expected: refused: the name cannot have a workspace
    """
    box.add_sessions("victim", name)
    assert box.call("write_file", "victim", {"path": "secret.txt", "content": "x"}).returncode == 0
    listed = box.call("list_dir", name, {"path": "victim"})
    record_property("observed", f"exit {listed.returncode}: {listed.stdout.strip()}")
    assert listed.returncode == 1
    assert listed.stdout.startswith(f"session {name!r} cannot have a workspace: ")
    assert "secret.txt" not in listed.stdout
    assert sorted(p.name for p in box.workspaces.iterdir() if p.is_dir()) == ["victim"]


def test_an_upgrade_finds_the_files_of_every_legacy_workspace(
    box: LoopdBox, record_property: Record
) -> None:
    """An upgrade of the workspace naming loses a session's files.

    Input: legacy folders mm_abc (shared by mm:abc and mm_abc) and terminal; read_file each
    Expected: each session reads the files it could read before, and they are apart after
    """
    box.add_sessions("mm:abc", "mm_abc", "terminal")
    for folder, text in [("mm_abc", "written by mm:abc and mm_abc"), ("terminal", "terminal's")]:
        (box.workspaces / folder).mkdir(parents=True)
        (box.workspaces / folder / "work.txt").write_text(text)
    results = {
        session: box.call("read_file", session, {"path": "work.txt"})
        for session in ("mm:abc", "mm_abc", "terminal")
    }
    record_property("observed", "; ".join(f"{s}: {r.stdout.strip()}" for s, r in results.items()))
    assert {s: (r.returncode, r.stdout) for s, r in results.items()} == {
        "mm:abc": (0, "written by mm:abc and mm_abc\n"),
        "mm_abc": (0, "written by mm:abc and mm_abc\n"),
        "terminal": (0, "terminal's\n"),
    }
    # From now on they are apart: a write by one is not seen by the other.
    box.call("write_file", "mm:abc", {"path": "work.txt", "content": "changed"})
    assert box.call("read_file", "mm_abc", {"path": "work.txt"}).stdout == (
        "written by mm:abc and mm_abc\n"
    )
