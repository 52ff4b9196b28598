"""run_command: timeout, output cap, clean environment, and the bubblewrap sandbox."""

import contextlib
import json
import socket
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from loopcommon.sandbox import HostView, Mount
from loopd.tools import (
    Sandbox,
    ToolContext,
    ToolResult,
    ToolSetupError,
    ToolsSpec,
    detect_sandbox,
    make_tool_context,
    plain_sandbox,
    run_core_tool,
)
from loopd.tools.command import (
    CommandOutcome,
    command_env,
    render_outcome,
    run_command,
)

SECRET = "the-secret-outside-the-workspace"


def names_in(directory: Path) -> list[str]:
    """The sorted entry names of a directory (a plain function: async tests stay readable)."""
    return sorted(path.name for path in directory.iterdir())


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
    timeout_s: float = 20.0,
    output_max_bytes: int = 10_000,
) -> CommandOutcome:
    return await run_command(
        command,
        workspace=workspace,
        sandbox=sandbox,
        timeout_s=timeout_s,
        output_max_bytes=output_max_bytes,
    )


# --- pure parts --------------------------------------------------------------------------------


def test_the_environment_is_three_variables(tmp_path: Path) -> None:
    assert command_env(tmp_path) == {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "LANG": "C.UTF-8",
    }


VIEW = HostView(
    "/usr/bin/bwrap",
    None,
    (Mount("--ro-bind-try", "/usr", "/usr"), Mount("--symlink", "usr/bin", "/bin")),
)


def test_the_sandbox_binds_only_the_system_and_the_workspace() -> None:
    sandbox = Sandbox(view=VIEW, shell="/bin/sh", reason="tests")
    argv = sandbox.argv(Path("/srv/ws"), "true")
    assert argv[:4] == ["/usr/bin/bwrap", "--unshare-all", "--unshare-user", "--disable-userns"]
    assert argv[-4:] == ["--", "/bin/sh", "-c", "true"]
    joined = " ".join(argv)
    assert "--die-with-parent --new-session --cap-drop ALL" in joined
    assert "--ro-bind-try /usr /usr --symlink usr/bin /bin" in joined
    # The kernel's default size, and no prlimit: the launcher sets the limits outside.
    assert "--dev /dev --tmpfs /tmp" in joined
    assert "prlimit" not in joined
    assert "--bind /srv/ws /srv/ws --chdir /srv/ws --clearenv" in joined
    assert "--share-net" not in joined
    read_write = [argv[i + 1] for i, arg in enumerate(argv) if arg in ("--bind", "--dev-bind")]
    assert read_write == ["/srv/ws"]


def test_privileges_are_kept_only_where_the_sandbox_says_why() -> None:
    kept = Sandbox(view=VIEW, shell="/bin/sh", reason="tests", privileges_kept="bwrap 0.6")
    argv = kept.argv(Path("/srv/ws"), "true")
    assert not {"--unshare-user", "--disable-userns", "--cap-drop"} & set(argv)
    assert kept.warning == (
        "run_command's sandbox keeps the capabilities it starts with (all of them for root) and "
        "lets commands make user namespaces (bwrap 0.6)"
    )


def test_render_outcome() -> None:
    assert render_outcome(CommandOutcome(0, False, "", False), 5) == "exit code 0\n(no output)"
    assert render_outcome(CommandOutcome(-9, False, "x", False), 5) == "killed by signal 9\nx"
    timed_out = render_outcome(CommandOutcome(None, True, "part", False), 0.5)
    assert timed_out == "timed out after 0.5 s; the command and its children were killed\npart"


# --- running, with and without the sandbox -----------------------------------------------------


@pytest.mark.anyio
async def test_a_command_runs_in_the_workspace(workspace: Path, sandbox: Sandbox) -> None:
    (workspace / "in.txt").write_text("data\n")
    outcome = await run(
        "pwd; cat in.txt; echo oops >&2; echo made > out.txt; exit 3", workspace, sandbox
    )
    assert outcome == CommandOutcome(3, False, f"{workspace}\ndata\noops\n", False)
    assert (workspace / "out.txt").read_text() == "made\n"


@pytest.mark.anyio
async def test_stdin_is_closed(workspace: Path, sandbox: Sandbox) -> None:
    outcome = await run("cat; echo after-cat", workspace, sandbox, timeout_s=10)
    assert outcome.output == "after-cat\n"


@pytest.mark.anyio
async def test_the_timeout_kills_the_command(workspace: Path, sandbox: Sandbox) -> None:
    started = time.monotonic()
    outcome = await run("echo before; sleep 30; echo after", workspace, sandbox, timeout_s=0.5)
    assert time.monotonic() - started < 10
    assert (outcome.exit_code, outcome.timed_out) == (None, True)
    assert outcome.output in ("before\n", "")  # "" only if the start itself took 0.5 s


@pytest.mark.anyio
async def test_the_timeout_kills_background_children_too(workspace: Path) -> None:
    outcome = await run(
        "sleep 30 & echo $! > child.pid; trap '' TERM; sleep 30",
        workspace,
        plain_sandbox("tests"),
        timeout_s=1.0,
    )
    assert outcome.timed_out
    assert _dead(int((workspace / "child.pid").read_text()))


@pytest.mark.anyio
async def test_children_left_behind_are_killed_when_the_command_exits(workspace: Path) -> None:
    started = time.monotonic()
    outcome = await run("sleep 30 & echo $!", workspace, plain_sandbox("tests"), timeout_s=20)
    assert time.monotonic() - started < 10
    assert outcome.exit_code == 0
    assert _dead(int(outcome.output))


def _dead(pid: int) -> bool:
    """Gone, or a zombie waiting for a reaper (it no longer runs either way)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")


@pytest.mark.anyio
async def test_a_flood_of_output_is_capped_without_holding_it(
    workspace: Path, sandbox: Sandbox
) -> None:
    tracemalloc.start()
    try:
        outcome = await run(
            "head -c 100000000 /dev/zero | tr '\\0' x; echo; echo the-end",
            workspace,
            sandbox,
            timeout_s=120,
            output_max_bytes=2_000,
        )
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert outcome.exit_code == 0
    assert outcome.cut
    assert peak < 8_000_000  # 100 MB went through; a few pipe reads were held at once at most
    head, note, tail = outcome.output.split("\n", 2)
    assert head == "x" * 1000
    assert (
        note
        == "[output cut: 100,000,009 bytes in all; 99,998,009 bytes in the middle are not shown]"
    )
    assert tail == "x" * 991 + "\nthe-end\n"


@pytest.mark.anyio
async def test_a_command_that_cannot_start_is_a_failure_not_a_crash(workspace: Path) -> None:
    broken = Sandbox(view=None, shell="/nonexistent/sh", reason="tests")
    outcome = await run("true", workspace, broken)
    assert outcome == CommandOutcome(
        127,
        False,
        "run_command: the command could not be started: /nonexistent/sh: No such file or "
        "directory\n",
        False,
    )


@pytest.mark.anyio
async def test_the_environment_is_clean(
    workspace: Path, sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOOPD_BOT_TOKEN", SECRET)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    outcome = await run("env", workspace, sandbox)
    variables = dict(line.split("=", 1) for line in outcome.output.splitlines())
    # The shell adds PWD, SHLVL and _ by itself; nothing else comes from outside.
    assert set(variables) - {"PWD", "SHLVL", "_"} == {"PATH", "HOME", "LANG"}
    assert variables["HOME"] == str(workspace)
    assert SECRET not in outcome.output
    assert "LOOPD" not in outcome.output


@pytest.mark.anyio
async def test_run_core_tool_runs_commands(
    make_ctx: Callable[..., ToolContext], workspace: Path
) -> None:
    ctx = make_ctx(command_timeout_max_s=0.5)
    ok = await run_core_tool("run_command", json.dumps({"command": "echo hi"}), make_ctx())
    assert ok == ToolResult("exit code 0\nhi\n", ok=True)
    failed = await run_core_tool("run_command", '{"command": "exit 2"}', make_ctx())
    assert failed == ToolResult("exit code 2\n(no output)", ok=False)
    slow = await run_core_tool("run_command", '{"command": "sleep 30", "timeout_s": 99}', ctx)
    assert slow == ToolResult(
        "[timeout_s lowered to the limit of 0.5 s]\n"
        "timed out after 0.5 s; the command and its children were killed\n(no output)",
        ok=False,
    )


# --- the bubblewrap sandbox --------------------------------------------------------------------


@pytest.mark.anyio
async def test_in_bwrap_the_state_dir_and_config_are_not_visible(
    tmp_path: Path, workspace: Path, outside: Path, bwrap_sandbox: Sandbox
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "sessions.db").write_text(SECRET)
    config = tmp_path / "loopd.toml"
    config.write_text(SECRET)
    probe = f"cat {state}/sessions.db {config} {outside}/secret.txt; ls {tmp_path}; ls /tmp"
    confined = await run(probe, workspace, bwrap_sandbox)
    assert SECRET not in confined.output
    assert confined.output.count("No such file or directory") == 3
    # Of the test's directory only the workspace is there; /tmp holds only the path to it.
    assert confined.output.endswith(f"\nworkspace\n{tmp_path.parts[2]}\n")
    # The same probe unconfined shows the test can tell the difference.
    plain = await run(probe, workspace, plain_sandbox("tests"))
    assert SECRET in plain.output


@pytest.mark.anyio
async def test_in_bwrap_there_is_no_network(workspace: Path, bwrap_sandbox: Sandbox) -> None:
    with _listening_socket() as port:
        probe = f"echo > /dev/tcp/127.0.0.1/{port} && echo connected"
        assert (await run(probe, workspace, plain_sandbox("tests"))).output == "connected\n"
        confined = await run(probe, workspace, bwrap_sandbox)
    assert confined.exit_code != 0
    assert "connected" not in confined.output


@contextlib.contextmanager
def _listening_socket() -> Iterator[int]:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        yield listener.getsockname()[1]


@pytest.mark.anyio
async def test_in_bwrap_the_system_is_read_only(workspace: Path, bwrap_sandbox: Sandbox) -> None:
    outcome = await run(
        "touch /usr/loopd-probe; touch /tmp/ok && echo tmp-ok", workspace, bwrap_sandbox
    )
    assert "Read-only file system" in outcome.output
    assert "tmp-ok" in outcome.output
    assert "loopd-probe" not in names_in(Path("/usr"))


@pytest.mark.anyio
async def test_detect_sandbox_without_bwrap_says_why(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    sandbox = await detect_sandbox()
    assert not sandbox.isolated
    assert sandbox.reason == "bwrap is not installed (Debian package bubblewrap)"
    assert sandbox.warning is not None
    assert sandbox.warning.startswith(
        "run_command is refused: commands cannot be sandboxed here (bwrap is not installed"
    )
    allowed = await detect_sandbox(allow_unsandboxed=True)
    assert not allowed.refused
    assert allowed.warning is not None
    assert allowed.warning.startswith("run_command is NOT sandboxed (bwrap is not installed")


@pytest.mark.anyio
async def test_detect_sandbox_when_bwrap_cannot_start(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    sandbox = await detect_sandbox()
    assert sandbox.reason == (
        "bwrap cannot create a sandbox here: bwrap: No permissions to create new namespace"
    )
    assert sandbox.warning is not None


@pytest.mark.anyio
async def test_a_bwrap_that_cannot_drop_privileges_confines_keeping_them(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, workspace: Path, bwrap_sandbox: Sandbox
) -> None:
    assert bwrap_sandbox.view is not None
    # bubblewrap before 0.8, which knows no --disable-userns, in front of the real one.
    old = tmp_path / "bin" / "bwrap"
    old.parent.mkdir()
    old.write_text(
        "#!/bin/sh\n"
        'for arg in "$@"; do [ "$arg" = --disable-userns ] && '
        "{ echo 'bwrap: Unknown option --disable-userns' >&2; exit 1; }; done\n"
        f'exec {bwrap_sandbox.view.bwrap} "$@"\n'
    )
    old.chmod(0o755)
    monkeypatch.setenv("PATH", str(old.parent))
    sandbox = await detect_sandbox()
    assert sandbox.isolated
    assert sandbox.privileges_kept == (
        "this bubblewrap cannot drop them: bwrap cannot create a sandbox here: "
        "bwrap: Unknown option --disable-userns"
    )
    assert sandbox.warning is not None
    assert "keeps the capabilities it starts with" in sandbox.warning
    outcome = await run("echo confined > out.txt; cat out.txt", workspace, sandbox)
    assert (outcome.exit_code, outcome.output) == (0, "confined\n")


def test_a_working_bwrap_gives_no_warning(bwrap_sandbox: Sandbox) -> None:
    assert bwrap_sandbox.warning is None
    assert bwrap_sandbox.reason.startswith("bubblewrap (")


# --- layouts that would expose loopd's own files -----------------------------------------------


def test_a_state_dir_inside_the_workspace_is_refused(workspace: Path, spec: ToolsSpec) -> None:
    with pytest.raises(ToolSetupError, match=r"state is inside .*workspace, which tools can read"):
        make_tool_context(workspace, spec, plain_sandbox("t"), protected=[workspace / "state"])
    with pytest.raises(ToolSetupError):
        make_tool_context(workspace, spec, plain_sandbox("t"), protected=[workspace])


def test_a_protected_path_under_a_system_mount_is_refused(
    workspace: Path, spec: ToolsSpec, bwrap_sandbox: Sandbox
) -> None:
    with pytest.raises(ToolSetupError, match=r"/etc/passwd is inside /etc/passwd"):
        make_tool_context(workspace, spec, bwrap_sandbox, protected=[Path("/etc/passwd")])


def test_a_state_dir_beside_the_workspace_is_fine(
    tmp_path: Path, workspace: Path, spec: ToolsSpec
) -> None:
    ctx = make_tool_context(workspace, spec, plain_sandbox("t"), protected=[tmp_path / "state"])
    assert ctx.workspace == workspace


def test_a_missing_workspace_is_refused(tmp_path: Path, spec: ToolsSpec) -> None:
    with pytest.raises(ToolSetupError, match="is not a directory"):
        make_tool_context(tmp_path / "nope", spec, plain_sandbox("t"))
