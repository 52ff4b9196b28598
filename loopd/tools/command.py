"""run_command: a shell command in the workspace, inside bubblewrap when it works here.

The command runs with the workspace as its working directory and home, a clean environment
(``PATH``, ``HOME``, ``LANG`` and nothing of loopd's), stdin closed, a timeout that kills its whole
process group, and an output cap that keeps the head and the tail and never holds more.

Inside bubblewrap it also sees only the system directories (read-only), a few files of ``/etc``,
a private ``/tmp`` and the workspace; no network, no other process, and never loopd's state
directory or config. Where bubblewrap is missing or cannot make namespaces, ``detect_sandbox``
says so and commands run as plain subprocesses: loopd should print ``Sandbox.warning`` at startup.
"""

import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import anyio
from anyio.abc import ByteReceiveStream, Process

from loopd.tools.errors import ToolFailure, ToolSetupError

COMMAND_PATH = "/usr/local/bin:/usr/bin:/bin"
COMMAND_LANG = "C.UTF-8"
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# Enough of /etc for users, the dynamic linker, Debian's command alternatives and the time zone.
_ETC_ENTRIES = (
    "/etc/passwd",
    "/etc/group",
    "/etc/nsswitch.conf",
    "/etc/hosts",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/alternatives",
    "/etc/localtime",
)
# After the command exits, how long its output may keep arriving from what it left behind.
_DRAIN_GRACE_S = 1.0


# --- pure decisions ----------------------------------------------------------------------------


def command_env(workspace: Path) -> dict[str, str]:
    """The whole environment of a command: nothing is inherited from loopd."""
    return {"PATH": COMMAND_PATH, "HOME": str(workspace), "LANG": COMMAND_LANG}


@dataclass(frozen=True)
class Mount:
    """One bubblewrap mount: ``--ro-bind-try SOURCE DEST`` or ``--symlink SOURCE DEST``."""

    option: str
    source: str
    dest: str


def bwrap_argv(
    bwrap: str, workspace: Path, command: Sequence[str], mounts: Iterable[Mount]
) -> list[str]:
    """The bubblewrap command line that runs ``command`` confined to ``workspace``."""
    argv = [bwrap, "--unshare-all", "--die-with-parent", "--new-session"]
    for mount in mounts:
        argv += [mount.option, mount.source, mount.dest]
    argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    # Bound at its own path, so paths in output mean the same inside and outside the sandbox.
    argv += ["--bind", str(workspace), str(workspace), "--chdir", str(workspace)]
    argv += ["--clearenv"]
    for name, value in command_env(workspace).items():
        argv += ["--setenv", name, value]
    return [*argv, "--", *command]


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
    """How commands run: inside bubblewrap (``bwrap`` set) or as plain subprocesses."""

    bwrap: str | None
    mounts: tuple[Mount, ...]
    shell: str
    reason: str

    @property
    def isolated(self) -> bool:
        return self.bwrap is not None

    @property
    def warning(self) -> str | None:
        """The line loopd prints at startup when commands run unconfined."""
        if self.isolated:
            return None
        return (
            f"run_command is NOT sandboxed ({self.reason}): commands can read any file loopd "
            "can, including its state directory and config, and can reach the network"
        )

    def visible_paths(self) -> list[Path]:
        return [Path(m.source) for m in self.mounts if m.option == "--ro-bind-try"]

    def argv(self, workspace: Path, command: str) -> list[str]:
        shell = [self.shell, "-c", command]
        if self.bwrap is None:
            return shell
        return bwrap_argv(self.bwrap, workspace, shell, self.mounts)


def default_shell() -> str:
    return "/bin/bash" if Path("/bin/bash").exists() else "/bin/sh"


def plain_sandbox(reason: str) -> Sandbox:
    """No confinement: commands run as plain subprocesses."""
    return Sandbox(bwrap=None, mounts=(), shell=default_shell(), reason=reason)


def system_mounts() -> tuple[Mount, ...]:
    """The system directories and /etc entries of this machine, as bubblewrap mounts."""
    mounts = []
    for path in (*_SYSTEM_DIRS, *_ETC_ENTRIES):
        if os.path.islink(path) and path in _SYSTEM_DIRS:
            # Merged /usr: /bin -> usr/bin stays a symlink, as on the host.
            mounts.append(Mount("--symlink", os.readlink(path), path))
        elif os.path.exists(path):
            mounts.append(Mount("--ro-bind-try", path, path))
    return tuple(mounts)


async def detect_sandbox(*, probe_timeout_s: float = 10.0) -> Sandbox:
    """Use bubblewrap if it is installed and can start a sandbox here; else say why not."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return plain_sandbox("bwrap is not installed (Debian package bubblewrap)")
    sandbox = Sandbox(bwrap=bwrap, mounts=system_mounts(), shell=default_shell(), reason="")
    with tempfile.TemporaryDirectory(prefix="loopd-sandbox-probe-") as probe_dir:
        argv = sandbox.argv(Path(await anyio.Path(probe_dir).resolve()), "exit 0")
        try:
            with anyio.fail_after(probe_timeout_s):
                probe = await anyio.run_process(argv, check=False, stdin=subprocess.DEVNULL)
        except (OSError, TimeoutError) as exc:
            return plain_sandbox(f"bwrap failed to start: {exc!r}")
    if probe.returncode != 0:
        lines = probe.stderr.decode("utf-8", errors="replace").strip().splitlines()
        detail = lines[0] if lines else f"exit code {probe.returncode}"
        return plain_sandbox(f"bwrap cannot create a sandbox here: {detail}")
    return Sandbox(bwrap, sandbox.mounts, sandbox.shell, reason=f"bubblewrap ({bwrap})")


# --- running -----------------------------------------------------------------------------------


class CappedOutput:
    """Keeps the first and last bytes of a stream, at most ``cap`` in all, and counts the rest."""

    def __init__(self, cap: int) -> None:
        self._head_cap = cap - cap // 2
        self._tail_cap = cap // 2
        self._head = bytearray()
        self._tail = bytearray()
        self.total = 0

    @property
    def held(self) -> int:
        return len(self._head) + len(self._tail)

    @property
    def cut(self) -> bool:
        return self.total > self.held

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self._head_cap - len(self._head)
        if room > 0:
            self._head += chunk[:room]
            chunk = chunk[room:]
        if not chunk or not self._tail_cap:
            return
        if len(chunk) >= self._tail_cap:
            self._tail = bytearray(chunk[-self._tail_cap :])
        else:
            self._tail += chunk
            excess = len(self._tail) - self._tail_cap
            if excess > 0:
                del self._tail[:excess]

    def render(self) -> str:
        if not self.cut:
            # Decoded together: a character may straddle the head and the tail.
            return (self._head + self._tail).decode("utf-8", errors="replace")
        head = self._head.decode("utf-8", errors="replace")
        tail = self._tail.decode("utf-8", errors="replace")
        left_out = self.total - self.held
        return (
            f"{head}\n[output cut: {self.total:,} bytes in all; {left_out:,} bytes in the "
            f"middle are not shown]\n{tail}"
        )


@dataclass(frozen=True)
class CommandOutcome:
    exit_code: int | None
    """None when the command was killed at the timeout."""
    timed_out: bool
    output: str
    cut: bool


async def run_command(
    command: str, *, workspace: Path, sandbox: Sandbox, timeout_s: float, output_max_bytes: int
) -> CommandOutcome:
    """Run ``command`` through the shell in ``workspace``; stdout and stderr are interleaved."""
    output = CappedOutput(output_max_bytes)
    try:
        process = await anyio.open_process(
            sandbox.argv(workspace, command),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=workspace,
            env=command_env(workspace),
            start_new_session=True,  # its own process group, so a kill reaches every child
        )
    except OSError as exc:
        raise ToolFailure(f"run_command: the command could not be started: {exc}") from exc
    try:
        if process.stdout is None:
            raise RuntimeError("the process was started without a stdout pipe")
        with anyio.move_on_after(timeout_s):
            await _collect(process, process.stdout, output)
        timed_out = process.returncode is None
    finally:
        _kill_group(process.pid)
        with anyio.CancelScope(shield=True):
            await process.aclose()
    return CommandOutcome(
        exit_code=None if timed_out else process.returncode,
        timed_out=timed_out,
        output=output.render(),
        cut=output.cut,
    )


async def _collect(process: Process, stdout: ByteReceiveStream, output: CappedOutput) -> None:
    """Read output until the command exits and its pipe closes (or a short grace runs out)."""
    drained = anyio.Event()

    async def drain() -> None:
        try:
            async for chunk in stdout:
                output.feed(chunk)
        except anyio.BrokenResourceError:
            pass  # the pipe broke: what arrived before is kept
        drained.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(drain)
        await process.wait()
        # Background children it left still hold the pipe open; they go with the command.
        _kill_group(process.pid)
        with anyio.move_on_after(_DRAIN_GRACE_S):
            await drained.wait()
        tg.cancel_scope.cancel()


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # the whole group has exited already
    except PermissionError:
        pass  # the group id was reused by a process that is not ours; nothing of ours is left


def render_outcome(outcome: CommandOutcome, timeout_s: float) -> str:
    """The text the model reads."""
    if outcome.timed_out:
        head = f"timed out after {timeout_s:g} s; the command and its children were killed"
    elif outcome.exit_code is not None and outcome.exit_code < 0:
        head = f"killed by signal {-outcome.exit_code}"
    else:
        head = f"exit code {outcome.exit_code}"
    if not outcome.output:
        return f"{head}\n(no output)"
    return f"{head}\n{outcome.output}"
