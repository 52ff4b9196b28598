"""Paths confined to the workspace: the pure rules, symlinks, swaps, and random paths."""

import contextlib
import os
import shutil
from pathlib import Path, PurePosixPath

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loopd.tools import PathRefused, ToolFailure
from loopd.tools.workspace import (
    Workspace,
    check_relative,
    confine,
    read_text_window,
    write_file_atomic,
)

SECRET = "the-secret-outside-the-workspace"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("a/b.txt", "a/b.txt"), ("./a//b/", "a/b"), ("", "."), (".", "."), ("a/./b", "a/b")],
)
def test_plain_relative_paths_are_accepted(raw: str, expected: str) -> None:
    assert check_relative(raw) == PurePosixPath(expected)


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ("/etc/passwd", "absolute paths are refused"),
        ("//x", "absolute paths are refused"),
        ("..", "'..' is refused"),
        ("a/../../x", "'..' is refused"),
        ("a/..", "'..' is refused"),
        ("a\x00b", "NUL"),
    ],
)
def test_absolute_dotdot_and_nul_are_refused(raw: str, reason: str) -> None:
    with pytest.raises(PathRefused, match=reason):
        check_relative(raw)


def test_confine_keeps_paths_under_the_root_and_refuses_the_rest() -> None:
    root = PurePosixPath("/w/ws")
    assert confine(root, PurePosixPath("/w/ws/a/b"), "a/b") == PurePosixPath("a/b")
    assert confine(root, root, ".") == PurePosixPath(".")
    for outside in ("/w/ws2/a", "/w", "/etc/passwd"):
        with pytest.raises(PathRefused, match="leads outside the workspace"):
            confine(root, PurePosixPath(outside), "x")


def test_symlinks_inside_the_workspace_are_followed(workspace: Path) -> None:
    (workspace / "real").mkdir()
    (workspace / "real" / "f.txt").write_text("x")
    (workspace / "alias").symlink_to("real")
    assert Workspace.at(workspace).resolve("alias/f.txt") == PurePosixPath("real/f.txt")


@pytest.mark.parametrize("link_target", ["outside", "outside/secret.txt", "outside/missing"])
def test_symlinks_out_of_the_workspace_are_refused(
    workspace: Path, outside: Path, link_target: str
) -> None:
    (workspace / "link").symlink_to(outside.parent / link_target)
    with pytest.raises(PathRefused, match="leads outside"):
        Workspace.at(workspace).resolve("link")
    with pytest.raises(PathRefused, match="leads outside"):
        Workspace.at(workspace).resolve("link/secret.txt")


def test_a_workspace_reached_through_a_symlink_still_works(tmp_path: Path, workspace: Path) -> None:
    (tmp_path / "alias").symlink_to(workspace)
    (workspace / "f.txt").write_text("hello\n")
    ws = Workspace.at(tmp_path / "alias")
    assert ws.root == workspace.resolve()
    window = read_text_window(ws, "f.txt", offset=1, limit=None, max_bytes=100)
    assert window.text == "hello\n"


def test_a_directory_swapped_for_a_symlink_after_the_check_is_not_followed(
    workspace: Path, outside: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (workspace / "d").mkdir()
    (workspace / "d" / "secret.txt").write_text("inside")
    checked = Workspace.resolve

    def resolve_then_swap(self: Workspace, raw: str) -> PurePosixPath:
        relative = checked(self, raw)
        shutil.rmtree(workspace / "d")
        (workspace / "d").symlink_to(outside)
        return relative

    monkeypatch.setattr(Workspace, "resolve", resolve_then_swap)
    ws = Workspace.at(workspace)
    with pytest.raises(PathRefused, match="changed while it was being opened"):
        read_text_window(ws, "d/secret.txt", offset=1, limit=None, max_bytes=100)
    before = sorted(outside.iterdir())
    with pytest.raises(PathRefused):
        write_file_atomic(ws, "d/new.txt", b"x", max_bytes=100)
    assert sorted(outside.iterdir()) == before


def test_a_file_swapped_for_a_symlink_after_the_check_is_not_followed(
    workspace: Path, outside: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (workspace / "f.txt").write_text("inside")
    checked = Workspace.resolve

    def resolve_then_swap(self: Workspace, raw: str) -> PurePosixPath:
        relative = checked(self, raw)
        (workspace / "f.txt").unlink()
        (workspace / "f.txt").symlink_to(outside / "secret.txt")
        return relative

    monkeypatch.setattr(Workspace, "resolve", resolve_then_swap)
    ws = Workspace.at(workspace)
    with pytest.raises(PathRefused):
        read_text_window(ws, "f.txt", offset=1, limit=None, max_bytes=100)
    with pytest.raises(PathRefused):
        write_file_atomic(ws, "f.txt", b"overwritten", max_bytes=100)
    assert (outside / "secret.txt").read_text() == SECRET


def test_a_file_where_a_directory_is_expected_is_a_clear_failure(workspace: Path) -> None:
    (workspace / "f.txt").write_text("x")
    with pytest.raises(ToolFailure, match=r"f\.txt/g: not a directory"):
        read_text_window(Workspace.at(workspace), "f.txt/g", offset=1, limit=None, max_bytes=9)


# --- random paths ------------------------------------------------------------------------------

_PARTS = st.sampled_from(
    ["a", "b", "f.txt", ".", "..", "", "in", "out", "abs", "loop", "up", "deep", "new", "..."]
)
_RAW_PATHS = st.builds(
    lambda lead, parts: lead + "/".join(parts),
    st.sampled_from(["", "", "/", "./", "//"]),
    st.lists(_PARTS, max_size=6),
)


@pytest.fixture(scope="module")
def maze(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """A workspace full of symlinks that lead in, out, up and round in circles."""
    base = tmp_path_factory.mktemp("maze")
    outside = base / "outside"
    outside.mkdir()
    (outside / "f.txt").write_text(SECRET)
    root = base / "workspace"
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "f.txt").write_text("inside\n")
    (root / "in").symlink_to("a")
    (root / "a" / "up").symlink_to("..")
    (root / "a" / "b" / "up").symlink_to("../..")
    (root / "a" / "b" / "deep").symlink_to("../../..")
    (root / "out").symlink_to("../outside")
    (root / "abs").symlink_to(outside)
    (root / "loop").symlink_to("loop")
    dangling = base.parent / f"not-there-{os.urandom(4).hex()}"
    (root / "a" / "new").symlink_to(dangling)
    return root, outside, dangling


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=_RAW_PATHS)
def test_random_relative_paths_never_resolve_outside(
    maze: tuple[Path, Path, Path], raw: str
) -> None:
    root, _, _ = maze
    workspace = Workspace.at(root)
    try:
        relative = workspace.resolve(raw)
    except PathRefused:
        return
    assert ".." not in relative.parts
    assert not relative.is_absolute()
    real = Path(os.path.realpath(workspace.root / relative))
    assert real == workspace.root or workspace.root in real.parents


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=_RAW_PATHS)
def test_random_writes_never_land_outside(maze: tuple[Path, Path, Path], raw: str) -> None:
    root, outside, dangling = maze
    workspace = Workspace.at(root)
    before = {path: path.read_bytes() for path in outside.rglob("*")}
    with contextlib.suppress(ToolFailure):
        write_file_atomic(workspace, raw, b"written", max_bytes=100)
    assert {path: path.read_bytes() for path in outside.rglob("*")} == before
    assert not dangling.exists()
