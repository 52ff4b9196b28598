"""One session cannot fill the disk under everyone's session log: each workspace has a quota
(``LOOPD_WORKSPACE_MAX_BYTES``), enforced by loopd outside the sandbox, and the filesystem keeps
a reserve for the session log (``LOOPD_DISK_RESERVE_BYTES``).

The tools run through ``run_core_tool`` as the engine calls them, in bubblewrap and on the plain
path an operator may allow, with a quota of 20 MiB.
"""

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from loopd.config import CORE_TOOLS_FILE
from loopd.sessionlog.store import SessionLog
from loopd.tools import (
    Sandbox,
    ToolContext,
    ToolLimits,
    detect_sandbox,
    load_tools_spec,
    make_tool_context,
    plain_sandbox,
    quota,
    run_core_tool,
)
from loopd.tools.quota import RESERVE_FILE, RESERVE_FILE_BYTES, ReserveFile, usage

QUOTA = 20 * 1024**2
# No reserve: what these limits allow depends on the quota alone, never on the free space of a
# disk that other processes fill and empty (the reserve has a test of its own).
LIMITS = ToolLimits(workspace_max_bytes=QUOTA, disk_reserve_bytes=0, command_timeout_max_s=120)
TWELVE_FILES = (
    "for i in $(seq 12); do head -c 5000000 /dev/zero > f$i || echo f$i not written; done; "
    "echo wrote"
)

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def detected() -> Sandbox:
    return anyio.run(detect_sandbox)


@pytest.fixture(params=["bwrap", "plain"])
def sandbox(request: pytest.FixtureRequest, detected: Sandbox) -> Sandbox:
    if request.param == "plain":
        return plain_sandbox("allowed by the operator")
    if not detected.isolated:
        pytest.fail(f"bubblewrap is installed for these tests but does not work: {detected.reason}")
    return detected


def context(root: Path, name: str, sandbox: Sandbox) -> ToolContext:
    workspace = root / name
    workspace.mkdir(parents=True)
    spec = load_tools_spec(CORE_TOOLS_FILE)
    return make_tool_context(workspace.resolve(), spec, sandbox, limits=LIMITS)


async def call(ctx: ToolContext, name: str, arguments: dict[str, object]) -> tuple[bool, str]:
    result = await run_core_tool(name, json.dumps(arguments), ctx)
    return result.ok, result.text


@pytest.mark.attack(
    attack="One session fills the disk under everyone's session log with many files, each "
    "under the file size cap",
    input="run_command writing twelve 5 MB files; workspace quota 20 MiB; then write_file and "
    "another command in the same workspace, and another session's write and log append",
    expected="the command is stopped or its files cut at the quota, with one line naming "
    "LOOPD_WORKSPACE_MAX_BYTES; later writes refused until files are deleted; the other "
    "session writes and its log appends",
)
async def test_a_workspace_is_held_to_its_quota(
    tmp_path: Path, sandbox: Sandbox, observed: Callable[[str], None]
) -> None:
    filler = context(tmp_path / "workspaces", "filler", sandbox)
    other = context(tmp_path / "workspaces", "other", sandbox)
    ok, text = await call(filler, "run_command", {"command": TWELVE_FILES, "timeout_s": 60})
    held = usage(filler.workspace)
    first = text.splitlines()[0]
    observed(f"{first} (the workspace holds {held / 1024**2:.1f} MiB)")
    assert first.startswith("["), text
    assert "LOOPD_WORKSPACE_MAX_BYTES" in first, text
    # No file grew past the room the workspace had when the command started.
    assert all(p.stat().st_size <= QUOTA for p in filler.workspace.iterdir())

    ok, text = await call(filler, "write_file", {"path": "more.txt", "content": "x" * 1000})
    observed(f"write_file after it: {text}")
    assert not ok
    assert text.startswith("refused: ")
    assert "LOOPD_WORKSPACE_MAX_BYTES" in text
    assert not (filler.workspace / "more.txt").exists()
    # A command in a workspace already past its quota is not stopped for what it found (it
    # outlasts many measurements here): no file may grow, and it may delete files.
    ok, text = await call(filler, "run_command", {"command": "sleep 1; echo x > more.txt; echo $?"})
    assert "File too large" in text, text
    assert not text.startswith("[stopped"), text

    # Deleting files makes room again.
    ok, text = await call(filler, "run_command", {"command": "rm -f f*; echo gone"})
    assert ok, text
    assert "gone" in text
    ok, text = await call(filler, "write_file", {"path": "more.txt", "content": "x" * 1000})
    assert ok, text

    # Another session is unaffected: it writes, and its session log appends.
    ok, text = await call(other, "write_file", {"path": "notes.txt", "content": "mine"})
    assert ok, text
    with SessionLog.open(tmp_path / "loopd.db") as log:
        log.ensure_session("other", 0)
        log.start_epoch("other", reason="new session", tools_text="[]", system_text="Be brief.")
        log.append_user("other", "still here", external_key="k1")
        assert any("still here" in (e.message or "") for e in log.entries("other"))


@pytest.mark.attack(
    attack="A session's command leaves the disk of the workspaces without room for the session log",
    input="LOOPD_DISK_RESERVE_BYTES above the size of the disk; write_file and "
    "run_command writing a file",
    expected="write_file refused, the command's file cannot grow, one line naming "
    "LOOPD_DISK_RESERVE_BYTES",
)
async def test_the_disk_keeps_a_reserve_for_the_session_log(
    tmp_path: Path, sandbox: Sandbox, observed: Callable[[str], None]
) -> None:
    # More than the whole disk: nothing may grow, however much other processes free meanwhile.
    reserve = shutil.disk_usage(tmp_path).total + 1
    spec = load_tools_spec(CORE_TOOLS_FILE)
    workspace = tmp_path / "w"
    workspace.mkdir()
    limits = ToolLimits(disk_reserve_bytes=reserve)
    ctx = make_tool_context(workspace.resolve(), spec, sandbox, limits=limits)
    ok, written = await call(ctx, "write_file", {"path": "a.txt", "content": "hello"})
    # The disk is under its reserve as the command starts; it runs on (outlasting many
    # measurements) and cannot grow a file.
    _, ran = await call(ctx, "run_command", {"command": "sleep 1; echo hello > b.txt; echo $?"})
    observed(f"write_file: {written}; run_command: {ran.splitlines()[0]}")
    assert not ok
    assert "LOOPD_DISK_RESERVE_BYTES" in written
    assert "File too large" in ran, ran
    assert ran.startswith("["), ran
    assert not ran.startswith("[stopped"), ran
    assert "LOOPD_DISK_RESERVE_BYTES" in ran.splitlines()[0]


@pytest.mark.attack(
    attack="A command fills the disk faster than it is measured, and the session log cannot "
    "record it",
    input="after a tool call, the state's disk has less free than the 8 MiB reserve file "
    "(the disk's free space read as 1 MiB)",
    expected="the reserve file is deleted before the result is appended, with one error line; "
    "made again once the disk has room",
)
def test_the_state_reserve_is_released_when_the_disk_is_full(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    observed: Callable[[str], None],
) -> None:
    reserve = ReserveFile(tmp_path / RESERVE_FILE)
    reserve.after_tool()
    made = (tmp_path / RESERVE_FILE).stat()
    assert made.st_blocks * 512 >= RESERVE_FILE_BYTES  # allocated, not a sparse file
    # What a disk filled by a command looks like to loopd (a real full disk needs a filesystem
    # of its own, which a test cannot mount unprivileged).
    monkeypatch.setattr(quota, "free_bytes", lambda path: 1024**2)
    reserve.after_tool()
    [line] = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    observed(f"reserve gone: {not (tmp_path / RESERVE_FILE).exists()}; {line}")
    assert not (tmp_path / RESERVE_FILE).exists()
    assert "released so that the session log can record what happened" in line
    monkeypatch.undo()
    reserve.after_tool()
    assert (tmp_path / RESERVE_FILE).exists()
