"""One bubblewrap sandbox for both daemons: the mounts, the command line, the start in a process
group of its own and the kill of that group.

brokerd runs its catalogue commands and MCP servers in it (``brokerd.confine``), loopd its
``run_command`` (``loopd.tools.command``). By default a sandbox

- sees the system directories (read-only), a few harmless files of ``/etc``, a private ``/tmp``
  of bounded size, and only the host paths it is given (``binds``, read-only unless writable),
  each at its own path; ``hidden`` paths stay invisible even inside a bound one;
- has no network (a network namespace of its own) and new user, PID, IPC, UTS and cgroup
  namespaces;
- holds no capability, even when started by root, and cannot make a user namespace of its own
  (``--cap-drop ALL --disable-userns``): a user namespace makes its maker root inside it, which
  is most of the kernel's attack surface open to an unprivileged program;
- has exactly the environment it is given (``--clearenv``);
- runs its command under ``prlimit`` (address space, file size, processes, CPU time, open files),
  set inside, so the process count is that of the sandbox's user namespace alone;
- dies with its parent, and killing the outer ``bwrap`` kills the whole tree: the sandbox's init
  dies with it, and with the init every process of its PID namespace, ``setsid`` children
  included.

Where the two daemons differ, ``Confinement`` names it: loopd's commands have the host's network
never, a writable workspace as their working directory, a ``/tmp`` of the kernel's default size
and their limits set outside the sandbox by loopd's launcher (``limits`` None), and keep their
privileges only where this host's bubblewrap cannot take them away (``drop_privileges``).

The command line is built by pure functions (``sandbox_argv``); ``system_mounts``, ``open_group``
and ``kill_group`` are the thin I/O shell.
"""

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import anyio
from anyio.abc import Process

MIB: Final = 1024 * 1024

SYSTEM_DIRS: Final = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# Enough of /etc for the dynamic linker, user names, Debian's alternatives and the time zone;
# nothing there names a secret.
ETC_FILES: Final = (
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/passwd",
    "/etc/group",
    "/etc/nsswitch.conf",
    "/etc/alternatives",
    "/etc/localtime",
)
# Added for a sandbox that has the host's network: name resolution and the CA certificates.
NETWORK_ETC_FILES: Final = (
    "/etc/resolv.conf",
    "/etc/hosts",
    "/etc/host.conf",
    "/etc/gai.conf",
    "/etc/ssl",
    "/etc/ca-certificates",
)
BWRAP_MISSING: Final = "bwrap is not installed (Debian package bubblewrap)"


@dataclass(frozen=True)
class ResourceLimits:
    """Per-process limits set by ``prlimit`` inside the sandbox (soft = hard, so the program
    cannot raise them)."""

    address_space_bytes: int = 2048 * MIB
    file_size_bytes: int = 64 * MIB
    processes: int = 64
    cpu_s: int = 60
    open_files: int = 256

    def prlimit_options(self) -> list[str]:
        pairs = (
            ("as", self.address_space_bytes),
            ("fsize", self.file_size_bytes),
            ("nproc", self.processes),
            ("cpu", self.cpu_s),
            ("nofile", self.open_files),
        )
        return [f"--{name}={value}:{value}" for name, value in pairs]


@dataclass(frozen=True)
class HiddenPath:
    """A path of the daemon's own (state, a secret file) that no sandbox may see."""

    path: Path
    is_dir: bool


@dataclass(frozen=True)
class Bind:
    """A host path shown to the program: ``source`` resolved on the host, seen at ``dest``."""

    source: Path
    dest: Path
    writable: bool = False


@dataclass(frozen=True)
class Confinement:
    """What one sandbox may see and use besides the system directories."""

    binds: tuple[Bind, ...] = ()
    network: bool = False
    """The host's network and its name-resolution files; else a network namespace of its own."""
    hidden: tuple[HiddenPath, ...] = ()
    limits: ResourceLimits | None = field(default_factory=ResourceLimits)
    """Set by ``prlimit`` inside the sandbox; None where the caller sets limits outside it
    (loopd's launcher, which counts the process cap over what the user already runs)."""
    tmp_bytes: int | None = 64 * MIB
    """The size of the private ``/tmp``; None: the kernel's default for a tmpfs (half the RAM)."""
    workdir: Path = Path("/")
    drop_privileges: bool = True
    """No capability and no user namespace inside (``--cap-drop ALL --disable-userns``, which
    takes a user namespace of the sandbox's own, ``--unshare-user``). False only where this host's
    bubblewrap cannot (older than 0.8, or a kernel that refuses it), said by the caller."""


@dataclass(frozen=True)
class Mount:
    """One bubblewrap mount option: ``--ro-bind-try SOURCE DEST`` or ``--symlink TARGET DEST``."""

    option: str
    source: str
    dest: str

    def argv(self) -> list[str]:
        return [self.option, self.source, self.dest]


@dataclass(frozen=True)
class HostView:
    """The programs and system mounts every sandbox on this host is built from (``prlimit`` is
    needed only by a confinement that sets its limits inside)."""

    bwrap: str
    prlimit: str | None
    system: tuple[Mount, ...]
    network_files: tuple[Mount, ...] = ()


# --- pure ----------------------------------------------------------------------------------------


def is_within(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def masks(confinement: Confinement, system: Iterable[Mount]) -> list[HiddenPath]:
    """Where each hidden path would appear in the sandbox, if it appears at all."""
    shown = [(Path(m.source), Path(m.dest)) for m in system if m.option != "--symlink"]
    shown += [(bind.source, bind.dest) for bind in confinement.binds]
    found: dict[Path, HiddenPath] = {}
    for hidden in confinement.hidden:
        for source, dest in shown:
            if is_within(hidden.path, source):
                where = dest / hidden.path.relative_to(source)
                found[where] = HiddenPath(where, hidden.is_dir)
    return sorted(found.values(), key=lambda hidden: len(hidden.path.parts))


def mask_argv(hidden: HiddenPath) -> list[str]:
    """An empty folder over a hidden folder; an unreadable device node over a hidden file."""
    if hidden.is_dir:
        return ["--tmpfs", str(hidden.path)]
    return ["--ro-bind", "/dev/null", str(hidden.path)]


def sandbox_argv(
    view: HostView,
    confinement: Confinement,
    command: Sequence[str],
    env: Mapping[str, str],
) -> list[str]:
    """The full command line: ``bwrap ... -- [prlimit ... --] command``."""
    argv = [view.bwrap, "--unshare-all"]
    if confinement.drop_privileges:
        argv += ["--unshare-user", "--disable-userns"]
    if confinement.network:
        argv.append("--share-net")
    argv += ["--die-with-parent", "--new-session"]
    if confinement.drop_privileges:
        argv += ["--cap-drop", "ALL"]
    system = [*view.system, *(view.network_files if confinement.network else ())]
    for mount in system:
        argv += mount.argv()
    argv += ["--proc", "/proc", "--dev", "/dev"]
    if confinement.tmp_bytes is not None:
        argv += ["--size", str(confinement.tmp_bytes)]
    argv += ["--tmpfs", "/tmp"]
    # Parents before children, so a nested declaration is mounted on top of its parent's.
    for bind in sorted(confinement.binds, key=lambda bind: len(bind.dest.parts)):
        argv += ["--bind" if bind.writable else "--ro-bind", str(bind.source), str(bind.dest)]
    for hidden in masks(confinement, system):
        argv += mask_argv(hidden)
    argv += ["--chdir", str(confinement.workdir), "--clearenv"]
    for name, value in env.items():
        argv += ["--setenv", name, value]
    argv.append("--")
    if confinement.limits is not None:
        if view.prlimit is None:
            raise ValueError("a confinement with limits needs prlimit in the host view")
        argv += [view.prlimit, *confinement.limits.prlimit_options(), "--"]
    return [*argv, *command]


def probe_failure(returncode: int, stderr: bytes) -> str | None:
    """Why a probe sandbox (``true`` run confined) failed, in one line; None when it ran."""
    if returncode == 0:
        return None
    lines = stderr.decode("utf-8", errors="replace").strip().splitlines()
    detail = lines[0] if lines else f"exit status {returncode}"
    return f"bwrap cannot create a sandbox here: {detail}"


# --- the host ------------------------------------------------------------------------------------


def system_mounts(paths: Iterable[str]) -> tuple[Mount, ...]:
    """Mounts for the paths that exist here; a merged-/usr symlink (/bin -> usr/bin) stays one."""
    mounts = []
    for path in paths:
        if os.path.islink(path) and path in SYSTEM_DIRS:
            mounts.append(Mount("--symlink", os.readlink(path), path))
        elif os.path.exists(path):
            mounts.append(Mount("--ro-bind-try", path, path))
    return tuple(mounts)


async def open_group(
    argv: Sequence[str],
    *,
    cwd: Path | str,
    env: Mapping[str, str],
    stdin: int | None = subprocess.DEVNULL,
) -> Process:
    """Start ``argv`` leading a new session; stdout and stderr come together on its stdout.

    Its process group is then the sandbox (or the launcher) and everything it starts outside a
    ``setsid``, so ``kill_group`` reaches them all.
    """
    return await anyio.open_process(
        argv,
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=dict(env),
        cwd=cwd,
        start_new_session=True,
    )


def kill_group(pid: int) -> None:
    """SIGKILL to the process group ``pid`` leads.

    For a sandbox, the outer bwrap dies; the sandbox's init gets SIGKILL with it
    (``--die-with-parent``), and the end of a PID namespace's init kills every process in it.
    A group already gone, or an id now another user's, leaves nothing of ours to kill.
    """
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
