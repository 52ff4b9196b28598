"""Confinement for the host programs brokerd runs for the box: bubblewrap, limits, a clean env.

Everything brokerd starts because the box asked (a catalogue command tool now, an MCP server
later) runs through here, so that a program fed hostile input, or reading box-written data, can
do no more than the catalogue declared:

- it sees the system directories (read-only), a few harmless files of ``/etc``, a private
  ``/tmp`` of bounded size, and only the host paths its declaration names (read-only unless
  declared writable), each at its own path;
- brokerd's own state and secrets (``hidden``) stay invisible even inside a declared path;
- it has no network unless declared (a new network namespace), and new user, PID, IPC, UTS and
  cgroup namespaces;
- its environment is exactly the one given (``--clearenv``);
- ``prlimit`` inside the sandbox caps address space, file size, processes, CPU time and open
  files (set inside, so the process count is that of the sandbox's user namespace alone);
- killing the outer ``bwrap`` kills the whole tree: the sandbox's init dies with its parent, and
  with it every process of the sandbox's PID namespace, ``setsid`` children included.

The argv is built by pure functions (``sandbox_argv``); ``detect_host_view`` and the process
helpers are the thin I/O shell.
"""

import contextlib
import functools
import os
import shutil
import signal
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import anyio
from anyio.abc import Process

from brokerd.errors import BrokerdError

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
# Added for a program that declares the network: name resolution and the CA certificates.
NETWORK_ETC_FILES: Final = (
    "/etc/resolv.conf",
    "/etc/hosts",
    "/etc/host.conf",
    "/etc/gai.conf",
    "/etc/ssl",
    "/etc/ca-certificates",
)
PROBE_TIMEOUT_S: Final = 10.0


class ConfinementError(BrokerdError):
    """Confinement cannot be set up as declared (bwrap missing, a declared path hides a secret)."""


@dataclass(frozen=True)
class ResourceLimits:
    """Per-process limits inside the sandbox (soft = hard, so the program cannot raise them)."""

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
    """A path of brokerd's own (state, a secret file) that no sandbox may see."""

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
    """What one program may see and use besides the system directories."""

    binds: tuple[Bind, ...] = ()
    network: bool = False
    hidden: tuple[HiddenPath, ...] = ()
    limits: ResourceLimits = field(default_factory=ResourceLimits)
    tmp_bytes: int = 64 * MIB


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
    """The programs and system mounts every sandbox on this host is built from."""

    bwrap: str
    prlimit: str
    system: tuple[Mount, ...]
    network_files: tuple[Mount, ...]


# --- pure ----------------------------------------------------------------------------------------


def is_within(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def check_declared(confinement: Confinement) -> None:
    """Refuse a declaration that would show one of brokerd's hidden folders whole."""
    for bind in confinement.binds:
        if not (bind.source.is_absolute() and bind.dest.is_absolute()):
            raise ConfinementError(f"{bind.dest}: a confined path must be absolute")
        for hidden in confinement.hidden:
            if is_within(bind.source, hidden.path):
                raise ConfinementError(
                    f"{bind.dest} is brokerd's own ({hidden.path}); it cannot be shown to a tool"
                )


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


def sandbox_argv(
    view: HostView,
    confinement: Confinement,
    command: Sequence[str],
    env: Mapping[str, str],
) -> list[str]:
    """The full command line: ``bwrap ... -- prlimit ... -- command``."""
    check_declared(confinement)
    argv = [view.bwrap, "--unshare-all", "--unshare-user", "--disable-userns"]
    if confinement.network:
        argv.append("--share-net")
    argv += ["--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    system = [*view.system, *(view.network_files if confinement.network else ())]
    for mount in system:
        argv += mount.argv()
    argv += ["--proc", "/proc", "--dev", "/dev"]
    argv += ["--size", str(confinement.tmp_bytes), "--tmpfs", "/tmp"]
    # Parents before children, so a nested declaration is mounted on top of its parent's.
    for bind in sorted(confinement.binds, key=lambda bind: len(bind.dest.parts)):
        argv += ["--bind" if bind.writable else "--ro-bind", str(bind.source), str(bind.dest)]
    for hidden in masks(confinement, system):
        argv += mask_argv(hidden)
    argv += ["--chdir", "/", "--clearenv"]
    for name, value in env.items():
        argv += ["--setenv", name, value]
    argv += ["--", view.prlimit, *confinement.limits.prlimit_options(), "--"]
    return [*argv, *command]


def mask_argv(hidden: HiddenPath) -> list[str]:
    """An empty folder over a hidden folder; an unreadable device node over a hidden file."""
    if hidden.is_dir:
        return ["--tmpfs", str(hidden.path)]
    return ["--ro-bind", "/dev/null", str(hidden.path)]


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


def bind(path: Path, *, writable: bool = False) -> Bind:
    """A declared host path (the operator's, never the box's), seen at its own name."""
    return Bind(path.resolve(), Path(os.path.normpath(path.absolute())), writable)


def hidden_paths(paths: Iterable[Path]) -> tuple[HiddenPath, ...]:
    """The existing ones among ``paths``, each under its given and its resolved name."""
    found: dict[Path, HiddenPath] = {}
    for path in paths:
        for name in (path.absolute(), path.resolve()):
            if name.exists():
                found[name] = HiddenPath(name, name.is_dir())
    return tuple(found.values())


@functools.cache
def detect_host_view() -> HostView:
    """bubblewrap and prlimit, checked by starting one sandbox; ``ConfinementError`` says why not.

    Cached: the answer does not change while brokerd runs.
    """
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise ConfinementError("bwrap is not installed (Debian package bubblewrap)")
    prlimit = shutil.which("prlimit", path="/usr/bin:/bin")
    if prlimit is None:
        raise ConfinementError("prlimit is not installed (Debian package util-linux)")
    system = system_mounts((*SYSTEM_DIRS, *ETC_FILES))
    view = HostView(bwrap, prlimit, system, system_mounts(NETWORK_ETC_FILES))
    argv = sandbox_argv(view, Confinement(), ["true"], {"PATH": "/usr/bin:/bin"})
    try:
        probe = subprocess.run(
            argv, capture_output=True, timeout=PROBE_TIMEOUT_S, check=False, env={}
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfinementError(f"bwrap failed to start: {exc}") from exc
    if probe.returncode != 0:
        lines = probe.stderr.decode("utf-8", errors="replace").strip().splitlines()
        detail = lines[0] if lines else f"exit status {probe.returncode}"
        raise ConfinementError(f"bwrap cannot create a sandbox here: {detail}")
    return view


async def open_confined(
    view: HostView,
    confinement: Confinement,
    command: Sequence[str],
    env: Mapping[str, str],
    *,
    stdin: int | None = subprocess.DEVNULL,
) -> Process:
    """Start ``command`` confined; stdout and stderr come together on ``process.stdout``.

    The outer bwrap leads a new session, so ``kill_tree`` can reach it with its group.
    """
    argv = sandbox_argv(view, confinement, command, env)
    return await anyio.open_process(
        argv,
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={},
        cwd="/",
        start_new_session=True,
    )


def kill_tree(process: Process) -> None:
    """Kill the sandbox and everything in it.

    SIGKILL to the outer bwrap's group ends bwrap; the sandbox's init gets SIGKILL with it
    (``--die-with-parent``), and the end of a PID namespace's init kills every process in it.
    """
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
