"""Confinement for the host programs brokerd runs for the box, in the shared sandbox
(``loopcommon.sandbox``: bubblewrap, limits, a clean environment, the whole tree killed).

Everything brokerd starts because the box asked (a catalogue command tool, an MCP server) runs
through here, so that a program fed hostile input, or reading box-written data, can do no more
than the catalogue declared: the sandbox's defaults (no capability, no user namespace of its own,
no network unless declared, limits set by ``prlimit`` inside, a private ``/tmp`` of bounded size),
the host paths its declaration names, and never brokerd's own state and secrets, which stay
hidden even inside a declared path. A declaration that would show one of them whole is refused
(``check_declared``, pure, run again by ``confined_argv`` on every command line); the probe of
this host's bubblewrap and the start of a confined program are the thin I/O shell.
"""

import functools
import os
import shutil
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Final

from anyio.abc import Process

from brokerd.errors import BrokerdError
from loopcommon.sandbox import (
    BWRAP_MISSING,
    ETC_FILES,
    NETWORK_ETC_FILES,
    SYSTEM_DIRS,
    Bind,
    Confinement,
    HiddenPath,
    HostView,
    is_within,
    open_group,
    probe_failure,
    sandbox_argv,
    system_mounts,
)

PROBE_TIMEOUT_S: Final = 10.0


class ConfinementError(BrokerdError):
    """Confinement cannot be set up as declared (bwrap missing, a declared path hides a secret)."""


# --- pure ----------------------------------------------------------------------------------------


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


def confined_argv(
    view: HostView,
    confinement: Confinement,
    command: Sequence[str],
    env: Mapping[str, str],
) -> list[str]:
    """The sandbox's command line for a checked declaration: ``bwrap ... -- prlimit ... --``."""
    check_declared(confinement)
    return sandbox_argv(view, confinement, command, env)


# --- the host ------------------------------------------------------------------------------------


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
        raise ConfinementError(BWRAP_MISSING)
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
    if failure := probe_failure(probe.returncode, probe.stderr):
        raise ConfinementError(failure)
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

    The outer bwrap leads a new session, so ``kill_group`` can reach it with its group.
    """
    argv = confined_argv(view, confinement, command, env)
    return await open_group(argv, cwd="/", env={}, stdin=stdin)
