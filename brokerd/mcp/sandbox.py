"""What a stdio MCP server sees inside its sandbox (``brokerd.confine``).

Besides the system directories and the paths its ``[[mcp]]`` table declares, a server needs its
own installation, read-only: a Python server its virtual environment and the interpreter that
environment was made from (``sys.base_prefix``, often outside ``/usr``: pyenv, a built Python),
a Node server the npm prefix holding its ``node_modules``. They are found from the command:

- the program is looked up on the server's ``PATH``, and followed through symbolic links;
- a program in ``<prefix>/bin/`` (a virtual environment's, an interpreter's) shows ``<prefix>``;
  one inside ``node_modules`` shows the folder holding the first ``node_modules``; any other
  shows its own folder;
- a script's ``#!`` interpreter (``#!/usr/bin/env node`` looks ``node`` up) is found the same way,
  and a virtual environment's base interpreter from its ``pyvenv.cfg``.

Whatever lies in the system directories is shown already. A folder that would show a home
directory or ``/`` whole is refused: install the server in a folder of its own.
"""

import os
import shutil
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Final

from brokerd.confine import ConfinementError, bind
from brokerd.mcp.config import McpServerConfig
from loopcommon.sandbox import (
    SYSTEM_DIRS,
    Bind,
    Confinement,
    HiddenPath,
    ResourceLimits,
    is_within,
)

BASE_PATH: Final = "/usr/local/bin:/usr/bin:/bin"
BASE_ENV: Final = {"PATH": BASE_PATH, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
SHEBANG_BYTES: Final = 256
# A server runs for days: its CPU time is not a per-call budget, so the sandbox's default of a
# minute would kill a healthy server. A day of CPU is still a bound.
SERVER_CPU_S: Final = 24 * 3600
TOO_WIDE: Final = (Path("/"), Path("/home"), Path("/root"), Path("/tmp"), Path("/opt"))


def server_env(config: McpServerConfig) -> dict[str, str]:
    """The server's whole environment: PATH and the locale, then its table's ``env``."""
    return {**BASE_ENV, **config.env}


def resolve_program(program: str, search_path: str) -> Path:
    """The program's path on the host (``ConfinementError`` if it is not found)."""
    if "/" in program:
        found = Path(program)
        if not found.is_absolute():
            raise ConfinementError(f"{program}: a server's program path must be absolute")
    else:
        located = shutil.which(program, path=search_path)
        if located is None:
            raise ConfinementError(f"{program}: not found on PATH {search_path}")
        found = Path(located)
    if not os.access(found, os.X_OK) or not found.is_file():
        raise ConfinementError(f"{found}: not an executable file")
    return Path(os.path.normpath(found.absolute()))


def install_folders(program: Path, search_path: str) -> list[Path]:
    """The folders outside the system directories that running ``program`` reads."""
    folders: list[Path] = []
    pending = [program]
    visited: set[Path] = set()
    while pending:
        path = pending.pop()
        for name in (path, path.resolve()):
            if name in visited:
                continue
            visited.add(name)
            folder = install_folder(name)
            if folder is not None and folder not in folders:
                folders.append(folder)
            pending += _interpreters(name, search_path)
            pending += _venv_interpreter(name)
    return folders


def install_folder(program: Path) -> Path | None:
    """The folder that holds ``program``'s installation; None inside the system directories."""
    if any(is_within(program, Path(system)) for system in SYSTEM_DIRS):
        return None
    parts = program.parts
    if "node_modules" in parts:
        return Path(*parts[: parts.index("node_modules")])
    if program.parent.name == "bin":
        return program.parent.parent
    return program.parent


def _interpreters(program: Path, search_path: str) -> list[Path]:
    """A script's ``#!`` interpreter (through ``env``), if it has one."""
    try:
        with program.open("rb") as file:
            head = file.read(SHEBANG_BYTES)
    except OSError:
        return []
    if not head.startswith(b"#!"):
        return []
    words = head[2:].split(b"\n", 1)[0].decode("utf-8", errors="replace").split()
    if not words:
        return []
    if Path(words[0]).name == "env":
        words = [word for word in words[1:] if not word.startswith("-")]
        if not words:
            return []
        located = shutil.which(words[0], path=search_path)
        return [Path(located)] if located else []
    return [Path(words[0])]


def _venv_interpreter(program: Path) -> list[Path]:
    """The base interpreter of the virtual environment ``program`` belongs to, if any."""
    if program.parent.name != "bin":
        return []
    config = program.parent.parent / "pyvenv.cfg"
    try:
        lines = config.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return []
    for line in lines:
        key, _, value = line.partition("=")
        if key.strip() == "home" and value.strip():
            return [Path(value.strip()) / "python3"]
    return []


def check_folders(folders: Iterable[Path]) -> None:
    home = Path.home()
    for folder in folders:
        if folder in TOO_WIDE or folder == home:
            raise ConfinementError(
                f"its installation would show {folder} whole; install it in a folder of its own "
                "(a virtual environment, an npm prefix)"
            )


def server_confinement(
    config: McpServerConfig, hidden: Sequence[HiddenPath], env: Mapping[str, str]
) -> Confinement:
    """The sandbox of a stdio server: its installation and declared paths, its network."""
    assert config.command is not None
    program = resolve_program(config.command[0], env.get("PATH", BASE_PATH))
    folders = install_folders(program, env.get("PATH", BASE_PATH))
    check_folders(folders)
    declared = config.declared_paths()
    binds: list[Bind] = [bind(folder) for folder in folders]
    binds += [bind(entry.path, writable=entry.writable) for entry in declared]
    limits = ResourceLimits(cpu_s=SERVER_CPU_S)
    return Confinement(tuple(_distinct(binds)), config.network, tuple(hidden), limits)


def _distinct(binds: Iterable[Bind]) -> list[Bind]:
    """One bind per destination; a writable declaration wins over a read-only one."""
    by_dest: dict[Path, Bind] = {}
    for entry in binds:
        known = by_dest.get(entry.dest)
        if known is None or (entry.writable and not known.writable):
            by_dest[entry.dest] = entry
    return list(by_dest.values())
