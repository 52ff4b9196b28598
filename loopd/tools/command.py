"""run_command: a shell command in the workspace, inside bubblewrap when it works here.

The command runs with the workspace as its working directory and home, a clean environment
(``PATH``, ``HOME``, ``LANG`` and nothing of loopd's), stdin closed, resource limits (memory, file
size, processes, CPU time), a timeout that kills every process it started (``launcher``: a child
subreaper, so a ``setsid`` daemon goes too), and an output cap that keeps the head and the tail
and never holds more.

Inside bubblewrap (the sandbox both daemons share, ``loopcommon.sandbox``) it also sees only the
system directories (read-only), a few files of ``/etc``, a private ``/tmp`` and the workspace; no
network, no other process, no capability (root's neither), no user namespace of its own, and
never loopd's state directory or config. Where bubblewrap is missing or cannot make namespaces,
``detect_sandbox`` says so, and run_command is refused (a tool error the model reads) unless the
operator allowed unsandboxed commands (``LOOPD_UNSANDBOXED_COMMANDS``): a plain subprocess sees
all loopd sees, brokerd's sockets included. Where this host's bubblewrap cannot take away the
capabilities and user namespaces (older than 0.8), commands keep them and ``Sandbox.warning``
says so. loopd logs ``Sandbox.warning`` once, when it first probes.
"""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import suppress
from dataclasses import dataclass, replace
from pathlib import Path

import anyio
from anyio.abc import ByteReceiveStream, Process

from loopcommon.capture import CappedOutput
from loopcommon.sandbox import (
    BWRAP_MISSING,
    ETC_FILES,
    SYSTEM_DIRS,
    Bind,
    Confinement,
    HostView,
    kill_group,
    open_group,
    probe_failure,
    sandbox_argv,
    system_mounts,
)
from loopd.tools import pidscgroup
from loopd.tools.errors import ToolFailure, ToolSetupError
from loopd.tools.launcher import CommandLimits
from loopd.tools.limits import ToolLimits
from loopd.tools.quota import POLL_S, free_bytes, usage

COMMAND_PATH = "/usr/local/bin:/usr/bin:/bin"
COMMAND_LANG = "C.UTF-8"
# The sandbox's /etc, and /etc/hosts: a command's own loopback (a test server it starts, a
# build tool) is reached by the name localhost.
COMMAND_ETC_FILES = (*ETC_FILES, "/etc/hosts")
# After the command exits, how long its output may keep arriving from what it left behind.
_DRAIN_GRACE_S = 1.0
# After SIGTERM, how long the launcher may take to kill the command's tree before its group is
# killed outright.
_END_GRACE_S = 5.0
LAUNCHER = Path(__file__).with_name("launcher.py")
UNSANDBOXED_SETTING = "LOOPD_UNSANDBOXED_COMMANDS"


# --- pure decisions ----------------------------------------------------------------------------


def command_env(workspace: Path) -> dict[str, str]:
    """The whole environment of a command: nothing is inherited from loopd."""
    return {"PATH": COMMAND_PATH, "HOME": str(workspace), "LANG": COMMAND_LANG}


def command_confinement(workspace: Path, *, drop_privileges: bool = True) -> Confinement:
    """The sandbox of a command: the workspace, writable, as its working directory.

    Bound at its own path, so paths in output mean the same inside and outside the sandbox. Its
    limits are the launcher's, set outside (``launcher_argv``), and its ``/tmp`` the kernel's
    default size: a build's temporary files are not capped below the machine.
    """
    return Confinement(
        binds=(Bind(workspace, workspace, writable=True),),
        limits=None,
        tmp_bytes=None,
        workdir=workspace,
        drop_privileges=drop_privileges,
    )


def launcher_argv(limits: CommandLimits, command: Sequence[str]) -> list[str]:
    """``command`` behind the launcher, which sets ``limits`` and kills the whole tree at the end.

    ``-I -S``: none of loopd's environment or site packages; the launcher needs only the stdlib.
    loopd's pid lets it end the command when loopd dies.
    """
    launcher = [sys.executable, "-I", "-S", str(LAUNCHER), limits.to_json(), str(os.getpid())]
    return [*launcher, "--", *command]


def command_limits(limits: ToolLimits, pids_cgroup: Path | None = None) -> CommandLimits:
    return CommandLimits(
        memory_bytes=limits.command_max_memory_bytes,
        file_bytes=limits.command_max_file_bytes,
        processes=limits.command_max_processes,
        cpu_s=limits.command_max_cpu_s,
        pids_cgroup=None if pids_cgroup is None else str(pids_cgroup),
    )


def check_protected_paths(
    workspace: Path, protected: Iterable[Path], visible: Iterable[Path]
) -> None:
    """Refuse a layout in which a command could see a protected path (state dir, config).

    ``workspace`` and every path must be resolved. ``visible`` are the other paths a command
    sees (the sandbox's system mounts).
    """
    roots = [workspace, *visible]
    for path in protected:
        for root in roots:
            if path == root or root in path.parents:
                raise ToolSetupError(f"{path} is inside {root}, which tools can read; move it out")


# --- the sandbox choice ------------------------------------------------------------------------


@dataclass(frozen=True)
class Sandbox:
    """How commands run: inside bubblewrap (``bwrap`` set), as plain subprocesses (the operator
    allowed it), or not at all (``refused``: no sandbox here, and no permission to go without).

    ``pids_cgroup_parent`` is where a per-command pids cgroup is made (root only, see
    ``pidscgroup``); ``runs_as_root`` tells whether the process cap needs it.
    ``privileges_kept`` says why commands keep their capabilities and may make user namespaces
    (this host's bubblewrap cannot take them away); None: they cannot.
    """

    view: HostView | None
    shell: str
    reason: str
    refused: bool = False
    pids_cgroup_parent: Path | None = None
    runs_as_root: bool = False
    privileges_kept: str | None = None

    @property
    def isolated(self) -> bool:
        return self.view is not None

    @property
    def warning(self) -> str | None:
        """The one line loopd logs when it probes, if commands are refused or less confined."""
        if self.refused:
            return (
                f"run_command is refused: commands cannot be sandboxed here ({self.reason}); "
                f"set {UNSANDBOXED_SETTING}=true to run them without a sandbox, where they can "
                "read all loopd can and reach brokerd's sockets"
            )
        lines = []
        if not self.isolated:
            lines.append(
                f"run_command is NOT sandboxed ({self.reason}, allowed by "
                f"{UNSANDBOXED_SETTING}): commands can read any file loopd can, including its "
                "state directory and config, and can reach the network and brokerd's sockets"
            )
        if self.isolated and self.privileges_kept is not None:
            lines.append(
                "run_command's sandbox keeps the capabilities it starts with (all of them for "
                f"root) and lets commands make user namespaces ({self.privileges_kept})"
            )
        if self.runs_as_root and self.pids_cgroup_parent is None:
            lines.append(
                "run_command's process cap does not hold: loopd runs as root, for whom the "
                "kernel ignores RLIMIT_NPROC, and no pids cgroup can be made here"
            )
        return "; ".join(lines) or None

    def refusal(self) -> str:
        """What the model reads when it calls run_command on a refused sandbox."""
        return (
            f"run_command is not available: commands cannot be sandboxed on this host "
            f"({self.reason}), and the operator has not allowed unsandboxed commands "
            f"({UNSANDBOXED_SETTING}). The file tools still work."
        )

    def visible_paths(self) -> list[Path]:
        mounts = () if self.view is None else self.view.system
        return [Path(m.source) for m in mounts if m.option == "--ro-bind-try"]

    def argv(self, workspace: Path, command: str) -> list[str]:
        shell = [self.shell, "-c", command]
        if self.view is None:
            return shell
        confinement = command_confinement(workspace, drop_privileges=self.privileges_kept is None)
        return sandbox_argv(self.view, confinement, shell, command_env(workspace))


def default_shell() -> str:
    return "/bin/bash" if Path("/bin/bash").exists() else "/bin/sh"


def plain_sandbox(reason: str) -> Sandbox:
    """No confinement: commands run as plain subprocesses (the operator allowed it)."""
    return Sandbox(
        view=None,
        shell=default_shell(),
        reason=reason,
        pids_cgroup_parent=pidscgroup.pids_cgroup_parent(),
        runs_as_root=os.geteuid() == 0,
    )


def refused_sandbox(reason: str) -> Sandbox:
    """No confinement is possible and none was allowed: run_command answers with an error."""
    return Sandbox(view=None, shell=default_shell(), reason=reason, refused=True)


def no_sandbox(reason: str, *, allow_unsandboxed: bool) -> Sandbox:
    return plain_sandbox(reason) if allow_unsandboxed else refused_sandbox(reason)


async def detect_sandbox(
    *, allow_unsandboxed: bool = False, probe_timeout_s: float = 10.0
) -> Sandbox:
    """Use bubblewrap if it is installed and can start a sandbox here; else say why not, and
    refuse commands unless ``allow_unsandboxed`` (the operator's ``LOOPD_UNSANDBOXED_COMMANDS``).

    A bubblewrap that cannot take away the capabilities and user namespaces (older than 0.8
    knows no ``--disable-userns``) still confines, keeping them, and the warning says why.
    """
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return no_sandbox(BWRAP_MISSING, allow_unsandboxed=allow_unsandboxed)
    sandbox = Sandbox(
        view=HostView(bwrap, None, system_mounts((*SYSTEM_DIRS, *COMMAND_ETC_FILES))),
        shell=default_shell(),
        reason=f"bubblewrap ({bwrap})",
        pids_cgroup_parent=await anyio.to_thread.run_sync(pidscgroup.pids_cgroup_parent),
        runs_as_root=os.geteuid() == 0,
    )
    refused = await _probe(sandbox, probe_timeout_s)
    if refused is None:
        return sandbox
    kept = replace(sandbox, privileges_kept=f"this bubblewrap cannot drop them: {refused}")
    failure = await _probe(kept, probe_timeout_s)
    if failure is None:
        return kept
    return no_sandbox(failure, allow_unsandboxed=allow_unsandboxed)


async def _probe(sandbox: Sandbox, timeout_s: float) -> str | None:
    """Why ``sandbox`` cannot run a command here, in one line; None when it can."""
    with tempfile.TemporaryDirectory(prefix="loopd-sandbox-probe-") as probe_dir:
        argv = sandbox.argv(Path(await anyio.Path(probe_dir).resolve()), "exit 0")
        try:
            with anyio.fail_after(timeout_s):
                probe = await anyio.run_process(argv, check=False, stdin=subprocess.DEVNULL)
        except (OSError, TimeoutError) as exc:
            return f"bwrap failed to start: {exc!r}"
    return probe_failure(probe.returncode, probe.stderr)


# --- running -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class CommandOutcome:
    exit_code: int | None
    """None when the command was killed at the timeout."""
    timed_out: bool
    output: str
    cut: bool
    quota: str | None = None
    """The workspace's quota or the disk's reserve, passed: the one line saying so."""
    stopped: bool = False
    """The command was stopped for passing it."""


async def run_command(
    command: str,
    *,
    workspace: Path,
    sandbox: Sandbox,
    timeout_s: float,
    output_max_bytes: int,
    limits: ToolLimits | None = None,
) -> CommandOutcome:
    """Run ``command`` through the shell in ``workspace``; stdout and stderr are interleaved.

    ``limits`` gives the ``command_max_*`` caps (default: ``ToolLimits()``'s).
    """
    if sandbox.refused:
        raise ToolFailure(sandbox.refusal())
    limits = limits or ToolLimits()
    quota = limits.quota

    def measure() -> tuple[int, int]:
        return usage(workspace), free_bytes(workspace)

    def passed() -> str | None:
        return quota.passed(*measure())

    started, free = await anyio.to_thread.run_sync(measure)

    def stop() -> str | None:
        return quota.stop(started, *measure())

    room = quota.room(started, free)
    # No file may grow past the room left (none left: files can still be deleted).
    limits = replace(limits, command_max_file_bytes=min(limits.command_max_file_bytes, room))
    cgroup = None
    if sandbox.pids_cgroup_parent is not None:
        cgroup = pidscgroup.make(sandbox.pids_cgroup_parent, limits.command_max_processes)
    try:
        outcome = await _run_launched(
            launcher_argv(command_limits(limits, cgroup), sandbox.argv(workspace, command)),
            workspace=workspace,
            timeout_s=timeout_s,
            output_max_bytes=output_max_bytes,
            watch=stop,
        )
        if outcome.quota is None:
            outcome = replace(outcome, quota=await anyio.to_thread.run_sync(passed))
        return outcome
    finally:
        if cgroup is not None:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(pidscgroup.remove, cgroup)


async def _run_launched(
    argv: list[str],
    *,
    workspace: Path,
    timeout_s: float,
    output_max_bytes: int,
    watch: Callable[[], str | None] | None = None,
) -> CommandOutcome:
    """``watch`` (blocking, run in a thread every ``POLL_S``) stops the command when it returns
    a line: the workspace's quota or the disk's reserve, passed."""
    output = CappedOutput(output_max_bytes, tail_bytes=output_max_bytes // 2)
    stopped: str | None = None
    try:
        # Its own process group: the last resort (``kill_group``) reaches it all.
        process = await open_group(argv, cwd=workspace, env=command_env(workspace))
    except OSError as exc:
        raise ToolFailure(f"run_command: the command could not be started: {exc}") from exc
    try:
        if process.stdout is None:
            raise RuntimeError("the process was started without a stdout pipe")
        with anyio.move_on_after(timeout_s):
            async with anyio.create_task_group() as tg:

                async def guard(check: Callable[[], str | None]) -> None:
                    nonlocal stopped
                    pause = POLL_S
                    while stopped is None:
                        await anyio.sleep(pause)
                        started = time.monotonic()
                        stopped = await anyio.to_thread.run_sync(check)
                        # A workspace of many files takes a while to measure: at most a tenth
                        # of loopd's time goes to it.
                        pause = max(POLL_S, 9 * (time.monotonic() - started))
                    tg.cancel_scope.cancel()

                if watch is not None:
                    tg.start_soon(guard, watch)
                await _collect(process, process.stdout, output)
                tg.cancel_scope.cancel()
        timed_out = process.returncode is None and stopped is None
    finally:
        with anyio.CancelScope(shield=True):
            await _end(process)
            await process.aclose()
    return CommandOutcome(
        exit_code=None if timed_out else process.returncode,
        timed_out=timed_out,
        output=output.text(),
        cut=output.cut,
        quota=stopped,
        stopped=stopped is not None,
    )


async def _end(process: Process) -> None:
    """Have the launcher kill the command's whole tree; kill its group if it does not in time."""
    if process.returncode is None:
        with suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        with anyio.move_on_after(_END_GRACE_S):
            await process.wait()
    kill_group(process.pid)


async def _collect(process: Process, stdout: ByteReceiveStream, output: CappedOutput) -> None:
    """Read output until the command exits and its pipe closes (or a short grace runs out)."""
    drained = anyio.Event()

    async def drain() -> None:
        try:
            async for chunk in stdout:
                output.add(chunk)
        except anyio.BrokenResourceError:
            pass  # the pipe broke: what arrived before is kept
        drained.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(drain)
        # The launcher exits only once the command and everything it left behind are dead.
        await process.wait()
        kill_group(process.pid)
        with anyio.move_on_after(_DRAIN_GRACE_S):
            await drained.wait()
        tg.cancel_scope.cancel()


_LIMIT_SIGNALS = {
    int(signal.SIGXCPU): "the CPU time limit",
    int(signal.SIGXFSZ): "the file size limit",
}
_SHELL_SIGNAL_BASE = 128  # a shell (and bubblewrap) reports death by signal N as exit 128+N


def render_outcome(outcome: CommandOutcome, timeout_s: float) -> str:
    """The text the model reads; a limit that ended the command is named."""
    code = outcome.exit_code
    note = ""
    if outcome.quota is not None:
        stop = "stopped: " if outcome.stopped else ""
        note = f"[{stop}{outcome.quota}]\n"
    if outcome.stopped:
        head = "the command and its children were killed"
    elif outcome.timed_out:
        head = f"timed out after {timeout_s:g} s; the command and its children were killed"
    elif code is not None and code < 0:
        limit = _LIMIT_SIGNALS.get(-code)
        head = f"killed by signal {-code}" + (f" ({limit})" if limit else "")
    elif code is not None and (limit := _LIMIT_SIGNALS.get(code - _SHELL_SIGNAL_BASE)):
        signum = code - _SHELL_SIGNAL_BASE
        head = f"exit code {code} (a process was killed by signal {signum}: {limit})"
    else:
        head = f"exit code {code}"
    if not outcome.output:
        return f"{note}{head}\n(no output)"
    return f"{note}{head}\n{outcome.output}"
