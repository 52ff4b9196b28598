"""Attacks on the machine through run_command: a fork bomb, a huge file, a memory hog, a CPU
spinner, a daemon that outlives its command. Each runs in bubblewrap and on the plain path an
operator may allow (``LOOPD_UNSANDBOXED_COMMANDS``), through ``run_core_tool`` as the engine
calls it, with small limits so that each shows quickly.

Each test is one row of docs/security.md's table (one per sandbox kind): its docstring gives the
attack (first line), the input and what is expected; ``record_property("observed", ...)`` says
what the run saw.
"""

import json
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import pytest

from loopd.config import CORE_TOOLS_FILE
from loopd.tools import (
    Sandbox,
    ToolContext,
    ToolLimits,
    detect_sandbox,
    load_tools_spec,
    make_tool_context,
    plain_sandbox,
    run_core_tool,
)
from tests.tools.toolcall import FORK_BOMB, kill_all, processes_with, unique_sleep

Record = Callable[[str, object], None]
TIGHT = ToolLimits(
    command_max_memory_bytes=256 * 1024**2,
    command_max_file_bytes=1024**2,
    command_max_processes=40,
    command_max_cpu_s=1,
    command_timeout_max_s=120,
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


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    path = tmp_path / "workspace"
    path.mkdir()
    return path.resolve()


@pytest.fixture
def ctx(workspace: Path, sandbox: Sandbox) -> ToolContext:
    return make_tool_context(workspace, load_tools_spec(CORE_TOOLS_FILE), sandbox, limits=TIGHT)


@pytest.fixture
def marker() -> Iterator[str]:
    value = unique_sleep()
    yield value
    kill_all(value)  # whatever a failed test left running


async def command(ctx: ToolContext, text: str, timeout_s: int = 60) -> tuple[bool, str]:
    arguments = json.dumps({"command": text, "timeout_s": timeout_s})
    result = await run_core_tool("run_command", arguments, ctx)
    return result.ok, result.text


async def test_a_fork_bomb_is_capped(
    ctx: ToolContext, workspace: Path, sandbox: Sandbox, record_property: Record
) -> None:
    """A fork bomb through run_command, in bubblewrap and unsandboxed (allowed).

    Input: python3 forking children that wait, up to 300; processes cap 40
    Expected: a fork is refused before 40 processes
    """
    (workspace / "bomb.py").write_text(FORK_BOMB)
    ok, text = await command(ctx, "python3 bomb.py")
    record_property("observed", " / ".join(text.splitlines()))
    lines = text.splitlines()
    assert lines[:2] == ["exit code 0", "fork refused: Resource temporarily unavailable"]
    assert 0 < int(lines[2].removeprefix("made ")) < TIGHT.command_max_processes
    assert ok


async def test_a_huge_file_write_is_refused(
    ctx: ToolContext, workspace: Path, sandbox: Sandbox, record_property: Record
) -> None:
    """A huge file written through run_command, in bubblewrap and unsandboxed.

    Input: head -c 5000000 /dev/zero > big; file size cap 1 MiB
    Expected: the write fails at 1 MiB (File too large); the shell goes on
    """
    ok, text = await command(ctx, "head -c 5000000 /dev/zero > big; echo status $?")
    size = (workspace / "big").stat().st_size
    record_property("observed", f"{' / '.join(text.splitlines())}; big is {size} bytes")
    assert "File too large" in text
    assert text.endswith("status 1\n")
    assert size == TIGHT.command_max_file_bytes
    assert ok  # the shell went on: the write failed, not the command


async def test_a_memory_hog_fails(
    ctx: ToolContext, sandbox: Sandbox, record_property: Record
) -> None:
    """A memory hog through run_command, in bubblewrap and unsandboxed.

    Input: python3 filling 512 MiB; memory cap 256 MiB
    Expected: the allocation fails (MemoryError)
    """
    ok, text = await command(ctx, "python3 -c 'hog = bytearray(512 * 1024**2); print(\"got it\")'")
    record_property("observed", " / ".join(text.splitlines()[-2:]))
    assert not ok
    assert text.startswith("exit code 1\n")
    assert text.rstrip().endswith("MemoryError")
    assert "got it" not in text


async def test_a_cpu_spinner_is_killed(
    ctx: ToolContext, sandbox: Sandbox, record_property: Record
) -> None:
    """A CPU spinner through run_command, in bubblewrap and unsandboxed.

    Input: while :; do :; done; CPU cap 1 s, timeout 120 s
    Expected: killed by SIGXCPU after 1 s of CPU, long before the timeout
    """
    ok, text = await command(ctx, "while :; do :; done", timeout_s=120)
    record_property("observed", text.splitlines()[0])
    assert not ok
    assert text.splitlines()[0] in (
        f"killed by signal {int(signal.SIGXCPU)} (the CPU time limit)",
        f"exit code {128 + signal.SIGXCPU} (a process was killed by signal "
        f"{int(signal.SIGXCPU)}: the CPU time limit)",
    )


async def test_a_setsid_child_does_not_survive_the_timeout(
    ctx: ToolContext, sandbox: Sandbox, marker: str, record_property: Record
) -> None:
    """A setsid child outlives its command's timeout, in bubblewrap and unsandboxed.

    Input: setsid sleep N & sleep N; timeout 2 s
    Expected: both sleeps are killed at the timeout
    """
    ok, text = await command(ctx, f"setsid sleep {marker} & echo started; sleep {marker}", 2)
    survivors = processes_with(marker)
    record_property("observed", f"{text.splitlines()[0]}; {len(survivors)} left running")
    assert not ok
    assert text == "timed out after 2 s; the command and its children were killed\nstarted\n"
    assert survivors == []


async def test_a_daemon_does_not_outlive_its_command(
    ctx: ToolContext, sandbox: Sandbox, marker: str, record_property: Record
) -> None:
    """A double-forked daemon outlives its command, in bubblewrap and unsandboxed.

    Input: (setsid sh -c 'sleep N' > /dev/null 2>&1 &); echo left
    Expected: the daemon is killed when the command ends
    """
    ok, text = await command(ctx, f"(setsid sh -c 'sleep {marker}' > /dev/null 2>&1 &); echo left")
    survivors = processes_with(marker)
    record_property("observed", f"{' / '.join(text.splitlines())}; {len(survivors)} left running")
    assert (ok, text) == (True, "exit code 0\nleft\n")
    assert survivors == []
