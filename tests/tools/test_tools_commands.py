"""``loopd tools call``: a core tool by hand, as a subprocess, with the exit status it promises."""

import json
from typing import Any

import anyio
import pytest

from loopd.config import Settings
from loopd.sessions import Runtime
from loopd.wire.assemble import ToolCall
from tests.tools.toolcall import LoopdBox


def one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    assert "Traceback" not in text
    return lines[0]


def test_a_tool_that_ran_prints_what_the_model_reads_and_exits_0(box: LoopdBox) -> None:
    box.add_sessions("work")
    wrote = box.call("write_file", "work", {"path": "notes/a.txt", "content": "hello\n"})
    assert (wrote.returncode, wrote.stdout) == (0, "created notes/a.txt (6 bytes)\n")
    read = box.call("read_file", "work", {"path": "notes/a.txt"})
    assert (read.returncode, read.stdout) == (0, "hello\n\n")
    assert (box.workspaces / "work" / "notes" / "a.txt").read_text() == "hello\n"


def test_a_core_tool_needs_no_model_named(box: LoopdBox) -> None:
    # The call sends no request, so nothing asks which model the server serves.
    box.add_sessions("work")
    listed = box.call("list_dir", "work", {"path": "."}, env={"LOOPD_MODEL": ""})
    assert (listed.returncode, listed.stdout, listed.stderr) == (
        0,
        ". is an empty directory\n",
        "",
    )


def test_a_tool_error_exits_1_with_the_text_the_model_reads(box: LoopdBox) -> None:
    box.add_sessions("s")
    missing = box.call("read_file", "s", {"path": "missing.txt"})
    assert (missing.returncode, missing.stdout) == (1, "missing.txt: no such file or directory\n")
    invalid = box.call("list_dir", "s", {"path": 3})
    assert invalid.returncode == 1
    assert invalid.stdout.startswith("list_dir: invalid arguments at arguments['path']: 3 is not")
    failed = box.call("run_command", "s", {"command": "echo out; exit 3"})
    assert (failed.returncode, failed.stdout) == (1, "exit code 3\nout\n\n")


@pytest.mark.parametrize(
    ("name", "arguments", "says"),
    [
        pytest.param(
            "nope",
            "{}",
            "loopd tools call: unknown tool 'nope'; the core tools are ",
            id="unknown-tool",
        ),
        pytest.param(
            "find_tool",
            '{"query": "x"}',
            "loopd tools call: find_tool is run by brokerd, not by loopd",
            id="broker-tool",
        ),
        pytest.param(
            "list_dir",
            "{bad",
            "loopd tools call: the arguments are not valid JSON "
            "(Expecting property name enclosed in double quotes at column 2)",
            id="bad-json",
        ),
        pytest.param(
            "list_dir",
            "[1]",
            "loopd tools call: the arguments must be one JSON object, not list",
            id="not-an-object",
        ),
    ],
)
def test_bad_usage_is_one_line_and_exit_2(
    box: LoopdBox, name: str, arguments: str, says: str
) -> None:
    box.add_sessions("s")
    called = box.call(name, "s", arguments)
    assert called.returncode == 2
    assert called.stdout == ""
    assert one_line(called.stderr).startswith(says)


def test_an_unknown_session_is_one_line_and_exit_2(box: LoopdBox) -> None:
    box.add_sessions("mm:abc", "terminal")
    called = box.call("list_dir", "mm:zzz", "{}")
    assert called.returncode == 2
    assert one_line(called.stderr) == (
        "loopd tools call: unknown session 'mm:zzz'; the sessions are: 'mm:abc', 'terminal'"
    )
    assert not (box.workspaces / "mm_zzz").exists()


def test_without_a_session_log_the_session_is_unknown(box: LoopdBox) -> None:
    called = box.call("list_dir", "s", "{}")
    assert called.returncode == 2
    assert one_line(called.stderr).startswith(
        "loopd tools call: unknown session 's': no session log"
    )
    assert not box.state_dir.exists()  # nothing was made


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["list_dir", "{}"], "the following arguments are required: --session"),
        (["list_dir", "--session", "s"], "the following arguments are required: JSON-ARGUMENTS"),
    ],
)
def test_a_missing_argument_exits_2(box: LoopdBox, args: list[str], says: str) -> None:
    called = box.run(["tools", "call", *args])
    assert called.returncode == 2
    assert says in called.stderr
    assert "Traceback" not in called.stderr


def test_the_call_appends_nothing_to_the_session_log(box: LoopdBox) -> None:
    box.add_sessions("s")
    before = box.entry_count("s")
    assert box.call("write_file", "s", {"path": "a", "content": "x"}).returncode == 0
    assert box.entry_count("s") == before


def test_it_answers_as_the_engine_does_for_a_model_call(box: LoopdBox) -> None:
    """The same text through ``SessionTools.run`` (the engine's path) and the command line."""
    box.add_sessions("work")
    (box.workspaces / "work" / "src").mkdir(parents=True)
    (box.workspaces / "work" / "src" / "m.py").write_text("def f():\n    return 1\n")
    calls: list[tuple[str, dict[str, Any]]] = [
        ("list_dir", {"path": "src"}),
        ("search_files", {"pattern": r"return \d", "regex": True}),
        ("search_files", {"pattern": r"(x)\1", "regex": True}),
        ("read_file", {"path": "../outside"}),
        ("run_command", {"command": "ls src; echo $HOME"}),
    ]
    values: dict[str, Any] = {"state_dir": box.state_dir, "model": "m"}
    settings = Settings(**values)

    async def in_process() -> list[str]:
        runtime = Runtime.open(settings)
        try:
            return [
                (
                    await runtime.tools.run("work", ToolCall(f"c{i}", name, json.dumps(args)), None)
                ).text
                for i, (name, args) in enumerate(calls)
            ]
        finally:
            await runtime.aclose()

    engine_texts = anyio.run(in_process)
    cli_texts = [box.call(name, "work", args).stdout for name, args in calls]
    assert cli_texts == [f"{text}\n" for text in engine_texts]
    assert "m.py" in engine_texts[-1]
