"""Session names to workspace folders: one folder per name, inside the root; legacy folders kept."""

import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loopd.tools.errors import WorkspaceRefused
from loopd.tools.workspace import (
    NAMING_MARK,
    WorkspaceMove,
    legacy_folder_name,
    migrate_legacy_workspaces,
    plan_workspace_moves,
    session_workspace,
    workspace_folder_name,
)


@pytest.mark.parametrize(
    ("session", "folder"),
    [
        ("terminal", "terminal"),
        ("mm_abc", "mm_abc"),
        ("mm:abc", "mm%3Aabc"),
        ("a/b", "a%2Fb"),
        ("100%", "100%25"),
        ("café", "caf%C3%A9"),
        ("...", "..."),
        (".hidden", ".hidden"),
    ],
)
def test_folder_names_are_readable_and_exact(session: str, folder: str) -> None:
    assert workspace_folder_name(session) == folder


@pytest.mark.parametrize("session", ["", ".", ".."])
def test_names_that_would_be_the_root_or_above_are_refused(session: str) -> None:
    with pytest.raises(WorkspaceRefused, match="cannot have a workspace"):
        workspace_folder_name(session)


def test_names_that_collided_get_their_own_folders() -> None:
    names = [
        "mm:abc",
        "mm_abc",
        "mm;abc",
        "mm abc",
        "mm\x00abc",
        "mm\udcffabc",
        "mm_abc" + "x" * 200,
    ]
    folders = [workspace_folder_name(name) for name in names]
    assert len(set(folders)) == len(names)
    assert len({legacy_folder_name(name) for name in names[:5]}) == 1  # as they were before


@given(st.text(min_size=1, max_size=300), st.text(min_size=1, max_size=300))
def test_different_names_never_share_a_folder(first: str, second: str) -> None:
    if first in ("", ".", "..") or second in ("", ".", ".."):
        return
    assert (workspace_folder_name(first) == workspace_folder_name(second)) == (first == second)


@given(st.text(max_size=400))
def test_a_folder_is_one_component_inside_the_root(session: str) -> None:
    if session in ("", ".", ".."):
        return
    folder = workspace_folder_name(session)
    assert "/" not in folder
    assert "\x00" not in folder
    assert folder not in (".", "..")
    assert len(folder.encode()) <= 200


def test_a_long_name_keeps_its_start_and_ends_with_its_hash() -> None:
    folder = workspace_folder_name(":" * 300)
    assert folder.startswith("%3A%3A")
    assert "%~" in folder
    assert len(folder) <= 200
    assert workspace_folder_name(":" * 301) != folder


def test_session_workspace_is_made_under_the_root(tmp_path: Path) -> None:
    folder = session_workspace(tmp_path, "mm:abc")
    assert folder == tmp_path / "mm%3Aabc"
    assert folder.is_dir()


def test_a_symlinked_workspace_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "mm%3Aabc").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(WorkspaceRefused, match="symlink"):
        session_workspace(tmp_path, "mm:abc")


# --- the upgrade from legacy folders -----------------------------------------------------------


def test_a_legacy_folder_of_one_session_is_renamed() -> None:
    assert plan_workspace_moves(["mm:abc", "terminal"], {"mm_abc", "terminal"}) == [
        WorkspaceMove("mm:abc", "mm_abc", "mm%3Aabc", copy=False)
    ]


def test_a_legacy_folder_shared_by_two_sessions_is_copied_then_renamed() -> None:
    assert plan_workspace_moves(["mm;abc", "mm:abc"], {"mm_abc"}) == [
        WorkspaceMove("mm:abc", "mm_abc", "mm%3Aabc", copy=True),
        WorkspaceMove("mm;abc", "mm_abc", "mm%3Babc", copy=False),
    ]


def test_a_legacy_folder_that_is_also_a_new_folder_stays_and_is_copied() -> None:
    assert plan_workspace_moves(["mm:abc", "mm_abc"], {"mm_abc"}) == [
        WorkspaceMove("mm:abc", "mm_abc", "mm%3Aabc", copy=True)
    ]


def test_nothing_moves_when_the_new_folder_exists_or_the_legacy_one_does_not() -> None:
    assert plan_workspace_moves(["mm:abc"], {"mm_abc", "mm%3Aabc"}) == []
    assert plan_workspace_moves(["mm:abc"], set()) == []
    assert plan_workspace_moves(["terminal"], {"terminal"}) == []


def test_refused_and_root_naming_sessions_are_not_migrated() -> None:
    assert plan_workspace_moves(["", ".", "..", "x/"], {"_", ".", ".."}) == []


def _tree(root: Path) -> dict[str, str]:
    return {
        str(path.relative_to(root)): path.read_text()
        for path in sorted(root.rglob("*"))
        if path.is_file() and not path.is_symlink() and path.name != NAMING_MARK
    }


def test_migration_keeps_every_file_a_session_could_see(tmp_path: Path) -> None:
    root = tmp_path / "workspaces"
    (root / "mm_abc" / "src").mkdir(parents=True)
    (root / "mm_abc" / "src" / "main.py").write_text("shared by mm:abc and mm_abc")
    (root / "mm_x").mkdir()
    (root / "mm_x" / "notes.txt").write_text("only mm:x")
    (root / "mm_x" / "link").symlink_to("notes.txt")
    moves = migrate_legacy_workspaces(root, ["mm:abc", "mm_abc", "mm:x", "terminal"])
    assert [(m.session, m.copy) for m in moves] == [("mm:abc", True), ("mm:x", False)]
    assert _tree(root) == {
        "mm%3Aabc/src/main.py": "shared by mm:abc and mm_abc",
        "mm_abc/src/main.py": "shared by mm:abc and mm_abc",
        "mm%3Ax/notes.txt": "only mm:x",
    }
    assert os.readlink(root / "mm%3Ax" / "link") == "notes.txt"  # kept as a link, not followed
    assert sorted(p.name for p in root.iterdir()) == [NAMING_MARK, "mm%3Aabc", "mm%3Ax", "mm_abc"]


def test_migration_runs_once_so_a_new_folder_is_never_handed_to_another_session(
    tmp_path: Path,
) -> None:
    root = tmp_path / "workspaces"
    assert migrate_legacy_workspaces(root, ["mm_abc"]) == []  # a fresh install: marked at once
    assert (root / NAMING_MARK).exists()
    session_workspace(root, "mm_abc").joinpath("private.txt").write_text("mm_abc's own")
    assert migrate_legacy_workspaces(root, ["mm_abc", "mm:abc"]) == []
    assert not (root / "mm%3Aabc").exists()


def test_migration_without_a_root_makes_it_and_marks_it(tmp_path: Path) -> None:
    root = tmp_path / "nowhere" / "workspaces"
    assert migrate_legacy_workspaces(root, ["mm:abc"]) == []
    assert (root / NAMING_MARK).is_file()
