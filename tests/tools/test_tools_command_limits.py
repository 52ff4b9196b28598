"""run_command's edges: refused without a sandbox, the launcher's parts, the process cap of an
ordinary user. The attacks each limit stops are in tests/security/test_tools_call_limits.py."""

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from loopd.tools import Sandbox, ToolLimits, plain_sandbox, run_core_tool
from loopd.tools.command import (
    LAUNCHER,
    CommandOutcome,
    command_limits,
    launcher_argv,
    refused_sandbox,
    render_outcome,
    run_command,
)
from loopd.tools.core import make_tool_context
from loopd.tools.launcher import (
    CommandLimits,
    descendants,
    lowered,
    parse_stat,
    rlimits,
)
from loopd.tools.pidscgroup import candidate_parents
from loopd.tools.spec import ToolsSpec
from tests.tools.toolcall import FORK_BOMB, as_user_of_its_own, open_folder, standalone_launcher

TIGHT = ToolLimits(
    command_max_memory_bytes=256 * 1024**2,
    command_max_file_bytes=1024**2,
    command_max_processes=40,
    command_max_cpu_s=1,
)


@pytest.fixture(params=["plain", "bwrap"])
def sandbox(request: pytest.FixtureRequest, detected_sandbox: Sandbox) -> Sandbox:
    if request.param == "plain":
        return plain_sandbox("tests")
    if not detected_sandbox.isolated:
        pytest.skip(f"bubblewrap does not work here: {detected_sandbox.reason}")
    return detected_sandbox


async def run(
    command: str,
    workspace: Path,
    sandbox: Sandbox,
    *,
    timeout_s: float = 60.0,
    limits: ToolLimits = TIGHT,
) -> CommandOutcome:
    return await run_command(
        command,
        workspace=workspace,
        sandbox=sandbox,
        timeout_s=timeout_s,
        output_max_bytes=10_000,
        limits=limits,
    )


# --- refused without a sandbox -----------------------------------------------------------------


@pytest.mark.anyio
async def test_without_a_sandbox_run_command_is_one_clear_error(
    workspace: Path, spec: ToolsSpec
) -> None:
    ctx = make_tool_context(workspace, spec, refused_sandbox("bwrap is not installed"))
    arguments = json.dumps({"command": "echo ran > ran.txt"})
    result = await run_core_tool("run_command", arguments, ctx)
    assert not result.ok
    assert result.text == (
        "run_command is not available: commands cannot be sandboxed on this host (bwrap is not "
        "installed), and the operator has not allowed unsandboxed commands "
        "(LOOPD_UNSANDBOXED_COMMANDS). The file tools still work."
    )
    assert not (workspace / "ran.txt").exists()
    listed = await run_core_tool("list_dir", "{}", ctx)
    assert listed.ok


@pytest.mark.anyio
async def test_default_limits_leave_ordinary_commands_alone(
    workspace: Path, sandbox: Sandbox
) -> None:
    outcome = await run(
        "python3 -c 'print(len(bytearray(64 * 1024**2)))' && head -c 3000000 /dev/zero > f "
        "&& wc -c < f",
        workspace,
        sandbox,
        limits=ToolLimits(),
    )
    assert outcome == CommandOutcome(0, False, f"{64 * 1024**2}\n3000000\n", False)


# --- the rendering -----------------------------------------------------------------------------


def test_a_limit_that_ended_a_command_is_named() -> None:
    killed = CommandOutcome(-signal.SIGXFSZ, False, "", False)
    assert render_outcome(killed, 5) == "killed by signal 25 (the file size limit)\n(no output)"
    reported = CommandOutcome(128 + signal.SIGXCPU, False, "x\n", False)
    assert render_outcome(reported, 5) == (
        "exit code 152 (a process was killed by signal 24: the CPU time limit)\nx\n"
    )
    assert render_outcome(CommandOutcome(137, False, "", False), 5) == "exit code 137\n(no output)"


# --- the launcher's pure parts -----------------------------------------------------------------


def test_parse_stat_reads_past_a_name_with_parentheses() -> None:
    assert parse_stat("4242 (a) b (c)) S 17 4242 4242 0 -1") == (4242, 17)


def test_descendants_follow_the_whole_tree() -> None:
    parents = {2: 1, 3: 2, 4: 3, 5: 1, 6: 99, 7: 6}
    assert descendants(parents, 2) == {3, 4}
    assert descendants(parents, 1) == {2, 3, 4, 5}
    assert descendants(parents, 4) == set()


def test_limits_are_lowered_to_a_hard_limit_in_force_never_raised() -> None:
    assert lowered((500, 500), (100, 200)) == (200, 200)
    assert lowered((50, 60), (100, 200)) == (50, 60)
    assert lowered((500, 500), (-1, -1)) == (500, 500)  # RLIM_INFINITY


def test_the_process_cap_counts_on_top_of_what_the_user_runs() -> None:
    import resource

    limits = CommandLimits(memory_bytes=1, file_bytes=2, processes=40, cpu_s=3)
    values = rlimits(limits, user_tasks=100)
    assert values[resource.RLIMIT_NPROC] == (140, 140)
    assert values[resource.RLIMIT_CPU] == (3, 4)
    assert values[resource.RLIMIT_CORE] == (0, 0)
    assert CommandLimits.from_json(limits.to_json()) == limits


def test_the_launcher_runs_isolated_from_loopds_environment() -> None:
    argv = launcher_argv(command_limits(TIGHT), ["/bin/sh", "-c", "true"])
    assert argv[:4] == [sys.executable, "-I", "-S", str(LAUNCHER)]
    assert argv[5:] == [str(os.getpid()), "--", "/bin/sh", "-c", "true"]


def test_pids_cgroup_candidates() -> None:
    mountinfo = (
        "30 25 0:26 / /sys/fs/cgroup/pids rw,relatime shared:9 - cgroup cgroup rw,pids\n"
        "31 25 0:27 / /sys/fs/cgroup/unified rw,relatime shared:10 - cgroup2 cgroup2 rw\n"
        "32 25 0:28 / /sys/fs/cgroup/memory rw,relatime shared:11 - cgroup cgroup rw,memory\n"
    )
    assert candidate_parents(mountinfo, "8:pids:/box\n4:memory:/x\n0::/\n") == [
        Path("/sys/fs/cgroup/pids/box"),
        Path("/sys/fs/cgroup/unified"),
    ]
    # In a v2 cgroup that holds processes, no child cgroup may take controllers.
    assert candidate_parents(mountinfo, "0::/user.slice\n") == []


# --- the process cap for a user that is not root -----------------------------------------------
# (the kernel exempts root from RLIMIT_NPROC, and loopd's deployment runs as an ordinary user)


@pytest.fixture
def open_place() -> Iterator[Path]:
    with open_folder("loopd-nproc-") as place:
        yield place


@pytest.mark.parametrize("confined", [False, True], ids=["plain", "bwrap"])
def test_rlimit_nproc_caps_a_fork_bomb_of_an_ordinary_user(
    open_place: Path, detected_sandbox: Sandbox, confined: bool
) -> None:
    if confined and not detected_sandbox.isolated:
        pytest.skip(f"bubblewrap does not work here: {detected_sandbox.reason}")
    (open_place / "bomb.py").write_text(FORK_BOMB)
    command = ["/usr/bin/python3", str(open_place / "bomb.py")]
    if confined:
        command = detected_sandbox.argv(open_place, "python3 bomb.py")
    limits = CommandLimits(memory_bytes=1024**3, file_bytes=1024**2, processes=40, cpu_s=30)
    done = subprocess.run(
        as_user_of_its_own(standalone_launcher(open_place, limits, command)),
        cwd=open_place,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "fork refused: Resource temporarily unavailable"
    assert 0 < int(lines[1].removeprefix("made ")) < 40
