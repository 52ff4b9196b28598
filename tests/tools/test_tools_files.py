"""The file tools and argument handling, through ``run_core_tool`` as the turn engine calls it."""

import json
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from loopd.tools import NotACoreToolError, ToolContext, ToolResult, run_core_tool
from loopd.tools.core import cap_text, parse_arguments
from loopd.tools.errors import ToolFailure
from loopd.tools.files import apply_edit

SECRET = "the-secret-outside-the-workspace"
MakeContext = Callable[..., ToolContext]


def names_in(directory: Path) -> list[str]:
    """The sorted entry names of a directory (a plain function: async tests stay readable)."""
    return sorted(path.name for path in directory.iterdir())


pytestmark = pytest.mark.anyio


async def call(ctx: ToolContext, name: str, **arguments: Any) -> ToolResult:
    return await run_core_tool(name, json.dumps(arguments), ctx)


# --- happy paths -------------------------------------------------------------------------------


async def test_write_then_read(ctx: ToolContext, workspace: Path) -> None:
    result = await call(ctx, "write_file", path="src/app/main.py", content="print('hé')\n")
    assert result == ToolResult("created src/app/main.py (13 bytes)", ok=True)
    assert (workspace / "src/app/main.py").read_text() == "print('hé')\n"
    assert await call(ctx, "read_file", path="src/app/main.py") == ToolResult(
        "print('hé')\n", ok=True
    )
    again = await call(ctx, "write_file", path="src/app/main.py", content="x")
    assert again.text == "wrote src/app/main.py (1 bytes)"


async def test_write_keeps_the_mode_of_the_file_it_replaces(
    ctx: ToolContext, workspace: Path
) -> None:
    script = workspace / "run.sh"
    script.write_text("old")
    script.chmod(0o755)
    assert (await call(ctx, "write_file", path="run.sh", content="new")).ok
    assert stat.S_IMODE(script.stat().st_mode) == 0o755
    assert names_in(workspace) == ["run.sh"]  # no temporary file left


async def test_read_pages_by_lines(ctx: ToolContext, workspace: Path) -> None:
    (workspace / "n.txt").write_text("".join(f"line {i}\n" for i in range(1, 11)))
    result = await call(ctx, "read_file", path="n.txt", offset=3, limit=2)
    assert (
        result.text
        == "line 3\nline 4\n\n[lines 3-4 of n.txt shown (71 bytes in all); continue with offset=5]"
    )
    tail = await call(ctx, "read_file", path="n.txt", offset=9)
    assert tail.text == "line 9\nline 10\n"
    past = await call(ctx, "read_file", path="n.txt", offset=50)
    assert past == ToolResult("n.txt has fewer than 50 lines", ok=True)


async def test_read_of_an_empty_file_says_so(ctx: ToolContext, workspace: Path) -> None:
    (workspace / "e.txt").write_bytes(b"")
    assert (await call(ctx, "read_file", path="e.txt")).text == "e.txt is empty"


async def test_a_read_of_a_missing_file_or_a_folder_says_what_the_folder_holds(
    ctx: ToolContext, workspace: Path
) -> None:
    (workspace / "reports").mkdir()
    (workspace / "reports" / "q1.txt").write_text("total: 12\n")
    (workspace / "notes.txt").write_text("x\n")
    guessed = await call(ctx, "read_file", path="reports/report1.txt")
    assert guessed == ToolResult(
        "reports/report1.txt: no such file or directory. The folder reports holds: "
        "q1.txt (10 bytes).",
        ok=False,
    )
    folder = await call(ctx, "read_file", path="reports")
    assert folder.text.endswith(". The folder reports holds: q1.txt (10 bytes).")
    assert not folder.ok
    # A folder that does not exist either: the nearest one above it that does.
    deeper = await call(ctx, "read_file", path="report/q1.txt")
    assert deeper.text == (
        "report/q1.txt: no such file or directory. The workspace folder (.) holds: "
        "notes.txt (2 bytes), reports/."
    )
    for n in range(25):
        (workspace / "reports" / f"r{n:02d}.txt").write_text("")
    many = await call(ctx, "read_file", path="reports/nope.txt")
    assert many.text.endswith(", r18.txt (0 bytes), and 6 more.")


async def test_a_read_in_an_empty_folder_or_outside_adds_nothing(ctx: ToolContext) -> None:
    assert (await call(ctx, "read_file", path="nope.txt")).text == (
        "nope.txt: no such file or directory"
    )
    outside = await call(ctx, "read_file", path="../x.txt")
    assert outside.text == "../x.txt: '..' is refused; give a path inside the workspace"


async def test_edit_replaces_the_one_match(ctx: ToolContext, workspace: Path) -> None:
    (workspace / "f.py").write_text("a = 1\nb = 2\n")
    result = await call(ctx, "edit_file", path="f.py", old_string="b = 2", new_string="b = 3")
    assert result == ToolResult("edited f.py: replaced 1 occurrence", ok=True)
    assert (workspace / "f.py").read_text() == "a = 1\nb = 3\n"


async def test_list_dir(ctx: ToolContext, workspace: Path, outside: Path) -> None:
    (workspace / "sub").mkdir()
    (workspace / "b.txt").write_text("12345")
    (workspace / "a-link").symlink_to(outside)
    result = await run_core_tool("list_dir", "{}", ctx)
    assert result.text == f"a-link -> {outside}\nb.txt (5 bytes)\nsub/"
    assert (await call(ctx, "list_dir", path="sub")).text == "sub is an empty directory"


async def test_list_dir_caps_entries(make_ctx: MakeContext, workspace: Path) -> None:
    for i in range(5):
        (workspace / f"f{i}").write_text("")
    result = await call(make_ctx(list_max_entries=3), "list_dir", path=".")
    assert result.text.splitlines() == [
        "f0 (0 bytes)",
        "f1 (0 bytes)",
        "f2 (0 bytes)",
        "[2 more entries not shown]",
    ]


async def test_search_substring_and_regex(ctx: ToolContext, workspace: Path, outside: Path) -> None:
    (workspace / "pkg").mkdir()
    (workspace / "pkg" / "a.py").write_text("def alpha():\n    return 1\n")
    (workspace / "b.py").write_text("alpha = 2\n")
    (workspace / "blob.bin").write_bytes(b"alpha\x00\x01")
    (workspace / ".git").mkdir()
    (workspace / ".git" / "config").write_text("alpha\n")
    (workspace / "escape").symlink_to(outside)
    (outside / "alpha.txt").write_text("alpha outside\n")
    result = await call(ctx, "search_files", pattern="alpha")
    assert result.text.splitlines() == [
        "b.py:1: alpha = 2",
        "pkg/a.py:1: def alpha():",
        "[1 binary file skipped]",
    ]
    regex = await call(ctx, "search_files", pattern=r"^\s+return \d", regex=True, path="pkg")
    assert regex.text == "pkg/a.py:2:     return 1"
    one_file = await call(ctx, "search_files", pattern="alpha", path="b.py")
    assert one_file.text == "b.py:1: alpha = 2"
    none = await call(ctx, "search_files", pattern="omega")
    assert none == ToolResult("no matches for 'omega' under .\n[1 binary file skipped]", ok=True)


async def test_search_stops_at_the_match_cap(make_ctx: MakeContext, workspace: Path) -> None:
    (workspace / "many.txt").write_text("hit\n" * 50 + "x" * 500 + "hit\n")
    ctx = make_ctx(search_max_matches=3, search_line_chars=10)
    result = await call(ctx, "search_files", pattern="hit")
    assert result.text.splitlines() == [
        "many.txt:1: hit",
        "many.txt:2: hit",
        "many.txt:3: hit",
        "[stopped at 3 matches; narrow the search]",
    ]
    long_line = await call(ctx, "search_files", pattern="xhit")
    assert long_line.text == "many.txt:51: xxxxxxxxxx [line cut]"


async def test_search_skips_large_files_and_says_so(make_ctx: MakeContext, workspace: Path) -> None:
    (workspace / "big.txt").write_text("needle\n" * 100)
    result = await call(make_ctx(search_max_file_bytes=100), "search_files", pattern="needle")
    assert result.text == "no matches for 'needle' under .\n[1 file over 100 bytes skipped]"


# --- paths out of the workspace ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "arguments"),
    [
        ("read_file", {"path": "../outside/secret.txt"}),
        ("read_file", {"path": "/etc/passwd"}),
        ("write_file", {"path": "../outside/new.txt", "content": "x"}),
        ("list_dir", {"path": ".."}),
        ("search_files", {"pattern": "secret", "path": "/"}),
        ("edit_file", {"path": "../outside/secret.txt", "old_string": "the", "new_string": "a"}),
    ],
)
async def test_dotdot_and_absolute_paths_are_refused(
    ctx: ToolContext, outside: Path, name: str, arguments: dict[str, Any]
) -> None:
    result = await call(ctx, name, **arguments)
    assert not result.ok
    assert "refused" in result.text
    assert SECRET not in result.text
    assert names_in(outside) == ["secret.txt"]


async def test_symlinks_out_are_refused_for_every_file_tool(
    ctx: ToolContext, workspace: Path, outside: Path
) -> None:
    (workspace / "dir-out").symlink_to(outside)
    (workspace / "file-out").symlink_to(outside / "secret.txt")
    calls: list[tuple[str, dict[str, Any]]] = [
        ("read_file", {"path": "file-out"}),
        ("read_file", {"path": "dir-out/secret.txt"}),
        ("write_file", {"path": "file-out", "content": "pwned"}),
        ("write_file", {"path": "dir-out/new.txt", "content": "pwned"}),
        ("edit_file", {"path": "file-out", "old_string": "secret", "new_string": "x"}),
        ("list_dir", {"path": "dir-out"}),
        ("search_files", {"pattern": "secret", "path": "dir-out"}),
    ]
    for name, arguments in calls:
        result = await call(ctx, name, **arguments)
        assert not result.ok, name
        assert "leads outside the workspace" in result.text, name
    assert (outside / "secret.txt").read_text() == SECRET
    assert names_in(outside) == ["secret.txt"]


# --- caps --------------------------------------------------------------------------------------


async def test_write_over_the_cap_is_refused_and_writes_nothing(
    make_ctx: MakeContext, workspace: Path
) -> None:
    ctx = make_ctx(write_max_bytes=10)
    (workspace / "keep.txt").write_text("original")
    result = await call(ctx, "write_file", path="keep.txt", content="é" * 6)
    assert result == ToolResult(
        "keep.txt: content is 12 bytes, over the 10 bytes limit; write it in smaller files", False
    )
    assert (workspace / "keep.txt").read_text() == "original"
    assert (await call(ctx, "write_file", path="ok.txt", content="x" * 10)).ok


async def test_a_huge_file_is_read_capped(make_ctx: MakeContext, workspace: Path) -> None:
    line = b"0123456789" * 9 + b"abcdefghi\n"  # 100 bytes
    with (workspace / "huge.log").open("wb") as f:
        for _ in range(200):
            f.write(line * 1000)  # 20 MB in all
    result = await call(make_ctx(read_max_bytes=1050), "read_file", path="huge.log")
    assert result.ok
    assert result.text == (
        (line * 10).decode()
        + "\n[lines 1-10 of huge.log shown (20,000,000 bytes in all); continue with offset=11]"
    )
    deep = await call(make_ctx(read_max_bytes=150), "read_file", path="huge.log", offset=150_000)
    assert deep.text.startswith(line.decode() + "\n[lines 150000-150000 of huge.log")


async def test_a_first_line_longer_than_the_cap_is_cut_with_a_note(
    make_ctx: MakeContext, workspace: Path
) -> None:
    (workspace / "min.js").write_text("é" * 100)
    result = await call(make_ctx(read_max_bytes=21), "read_file", path="min.js")
    text, note = result.text.split("\n", 1)
    assert text == "é" * 10  # the half character at the cap is dropped, not garbled
    assert note.startswith("[line 1 is longer than 21 bytes and was cut")


async def test_binary_and_special_files_are_not_read(ctx: ToolContext, workspace: Path) -> None:
    (workspace / "a.bin").write_bytes(b"\x7fELF\x00\x00")
    os.mkfifo(workspace / "pipe")
    binary = await call(ctx, "read_file", path="a.bin")
    assert binary == ToolResult("a.bin: a binary file (6 bytes); not shown", ok=False)
    fifo = await call(ctx, "read_file", path="pipe")  # must not wait for a writer
    assert fifo == ToolResult("pipe: not a regular file", ok=False)
    directory = await call(ctx, "read_file", path=".")
    assert directory == ToolResult(". is the workspace directory, not a file", ok=False)


async def test_the_result_text_is_capped_with_a_note() -> None:
    assert cap_text("abcdef", 6) == "abcdef"
    assert cap_text("abcdefgh", 3) == "abc\n[result cut: 8 characters in all, the first 3 shown]"


async def test_every_result_passes_through_the_final_cap(
    make_ctx: MakeContext, workspace: Path
) -> None:
    (workspace / "f.txt").write_text("x" * 100)
    result = await call(make_ctx(result_max_chars=40), "read_file", path="f.txt")
    assert result.text == "x" * 40 + "\n[result cut: 100 characters in all, the first 40 shown]"


# --- edit_file matching ------------------------------------------------------------------------


async def test_edit_with_no_match_changes_nothing(ctx: ToolContext, workspace: Path) -> None:
    (workspace / "f.txt").write_text("one two\n")
    result = await call(ctx, "edit_file", path="f.txt", old_string="three", new_string="3")
    assert not result.ok
    assert result.text == "f.txt: old_string was not found; read the file and copy the text exactly"
    assert (workspace / "f.txt").read_text() == "one two\n"


async def test_edit_with_several_matches_changes_nothing(ctx: ToolContext, workspace: Path) -> None:
    (workspace / "f.txt").write_text("x = 1\nx = 1\nx = 1\n")
    result = await call(ctx, "edit_file", path="f.txt", old_string="x = 1", new_string="x = 2")
    assert not result.ok
    assert "old_string occurs 3 times; include more surrounding text" in result.text
    assert (workspace / "f.txt").read_text() == "x = 1\nx = 1\nx = 1\n"


def test_apply_edit_refuses_a_no_op() -> None:
    with pytest.raises(ToolFailure, match="the same"):
        apply_edit("abc", "b", "b", "f")
    assert apply_edit("abc", "b", "", "f") == "ac"


async def test_edit_of_a_missing_file(ctx: ToolContext) -> None:
    result = await call(ctx, "edit_file", path="nope.txt", old_string="a", new_string="b")
    assert result == ToolResult("nope.txt: no such file or directory", ok=False)


# --- arguments ---------------------------------------------------------------------------------


async def test_arguments_that_are_not_json_are_named(ctx: ToolContext) -> None:
    result = await run_core_tool("read_file", '{"path": "a.txt"', ctx)
    assert not result.ok
    assert result.text.startswith("read_file: the arguments are not valid JSON (")
    assert result.text.endswith("; send one JSON object")


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [
        ("{}", "invalid arguments: 'path' is a required property"),
        ('{"path": 3}', "invalid arguments at arguments['path']: 3 is not of type 'string'"),
        ('{"path": "a", "offset": 0}', "at arguments['offset']: 0 is less than the minimum of 1"),
        ('{"path": "a", "mode": "r"}', "('mode' was unexpected)"),
        ('["a"]', "['a'] is not of type 'object'"),
        ('"a"', "'a' is not of type 'object'"),
    ],
)
async def test_schema_violations_are_named(ctx: ToolContext, arguments: str, problem: str) -> None:
    result = await run_core_tool("read_file", arguments, ctx)
    assert not result.ok
    assert problem in result.text
    assert result.text.endswith("the parameters are: path, offset (optional), limit (optional)")


async def test_empty_arguments_count_as_an_empty_object(ctx: ToolContext, workspace: Path) -> None:
    (workspace / "x").write_text("")
    assert (await run_core_tool("list_dir", "", ctx)).text == "x (0 bytes)"
    missing = await run_core_tool("read_file", " ", ctx)
    assert "'path' is a required property" in missing.text


async def test_lone_surrogates_are_refused(ctx: ToolContext, workspace: Path) -> None:
    result = await run_core_tool("write_file", '{"path": "a\\ud800", "content": "x"}', ctx)
    assert result == ToolResult(
        "write_file: the arguments contain a lone surrogate (\\ud800-\\udfff)", ok=False
    )
    assert names_in(workspace) == []


async def test_deeply_nested_arguments_are_a_result_not_a_crash(ctx: ToolContext) -> None:
    result = await run_core_tool("read_file", "[" * 100_000 + "]" * 100_000, ctx)
    assert not result.ok
    assert "read_file:" in result.text


async def test_an_undeclared_tool_is_a_result(ctx: ToolContext) -> None:
    result = await run_core_tool("delete_everything", "{}", ctx)
    assert not result.ok
    assert result.text.startswith("there is no tool 'delete_everything'; the tools are read_file")


@pytest.mark.parametrize("name", ["find_tool", "call_tool"])
async def test_broker_tools_are_not_run_here(ctx: ToolContext, name: str) -> None:
    with pytest.raises(NotACoreToolError):
        await run_core_tool(name, "{}", ctx)


def test_parse_arguments_returns_the_object() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert parse_arguments("t", '{"a": 1}', schema) == {"a": 1}
    with pytest.raises(ToolFailure, match="it takes no arguments"):
        parse_arguments("t", "[]", {"type": "object"})
