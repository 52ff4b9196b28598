"""Attacks on the session-to-workspace mapping, driven through ``loopd tools call``.

Each test records one row of the security table (attack, input, expected, observed) as report
properties: ``pytest --junitxml`` carries them to the generator of docs/security.md.
"""

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.tools.toolcall import LoopdBox, record_attack

Record = Callable[[str, object], None]


@pytest.fixture
def box(tmp_path: Path) -> LoopdBox:
    return LoopdBox(tmp_path)


def test_two_sessions_whose_names_differ_in_punctuation_do_not_share_files(
    box: LoopdBox, record_property: Record
) -> None:
    """mm:abc and mm_abc mapped onto one folder: one session read and overwrote the other's."""
    box.add_sessions("mm:abc", "mm_abc")
    wrote = box.call("write_file", "mm:abc", {"path": "secret.txt", "content": "mm:abc only"})
    assert wrote.returncode == 0
    read = box.call("read_file", "mm_abc", {"path": "secret.txt"})
    record_attack(
        record_property,
        attack="one session reads another's workspace through a colliding name",
        input="write_file secret.txt as session mm:abc, then read_file secret.txt as mm_abc",
        expected="not found: each name has its own folder",
        observed=f"exit {read.returncode}: {read.stdout.strip()}",
    )
    assert (read.returncode, read.stdout) == (1, "secret.txt: no such file or directory\n")
    assert sorted(p.name for p in box.workspaces.iterdir() if p.is_dir()) == [
        "mm%3Aabc",
        "mm_abc",
    ]


@pytest.mark.parametrize("name", [".", ".."], ids=["dot", "dotdot"])
def test_a_session_named_dot_cannot_read_every_workspace(
    box: LoopdBox, record_property: Record, name: str
) -> None:
    """'.' mapped onto the workspaces root: list_dir and read_file saw every session's files."""
    box.add_sessions("victim", name)
    assert box.call("write_file", "victim", {"path": "secret.txt", "content": "x"}).returncode == 0
    listed = box.call("list_dir", name, {"path": "victim"})
    record_attack(
        record_property,
        attack="a session whose name is the workspaces root (or above) reads every workspace",
        input=f"list_dir victim as session {name!r}",
        expected="refused: the name cannot have a workspace",
        observed=f"exit {listed.returncode}: {listed.stdout.strip()}",
    )
    assert listed.returncode == 1
    assert listed.stdout.startswith(f"session {name!r} cannot have a workspace: ")
    assert "secret.txt" not in listed.stdout
    assert sorted(p.name for p in box.workspaces.iterdir() if p.is_dir()) == ["victim"]


def test_an_upgrade_finds_the_files_of_every_legacy_workspace(
    box: LoopdBox, record_property: Record
) -> None:
    """Workspaces written under the legacy naming are found after the upgrade; none is lost."""
    box.add_sessions("mm:abc", "mm_abc", "terminal")
    for folder, text in [("mm_abc", "written by mm:abc and mm_abc"), ("terminal", "terminal's")]:
        (box.workspaces / folder).mkdir(parents=True)
        (box.workspaces / folder / "work.txt").write_text(text)
    results = {
        session: box.call("read_file", session, {"path": "work.txt"})
        for session in ("mm:abc", "mm_abc", "terminal")
    }
    record_attack(
        record_property,
        attack="an upgrade of the workspace naming loses a session's files",
        input="legacy folders mm_abc (shared by mm:abc and mm_abc) and terminal; read_file each",
        expected="each session reads the files it could read before",
        observed="; ".join(f"{s}: {r.stdout.strip()}" for s, r in results.items()),
    )
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
