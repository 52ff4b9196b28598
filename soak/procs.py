"""Child processes of the run: a supervisor that restarts them as systemd would, and what
``/proc`` says about them (memory, open files, children).

The run makes itself a child subreaper (``PR_SET_CHILD_SUBREAPER``): a process orphaned by a
kill (a tool brokerd was running, a sandbox loopd started) is re-parented to the run instead of
init, so at the end every process the run ever caused is still in view, and one left running is
a leak the run can name.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import anyio
from anyio.abc import Process

log = logging.getLogger("soak.procs")

PR_SET_CHILD_SUBREAPER = 36
RESTART_S = 1.0  # RestartSec=1
START_LIMIT = (5, 10.0)  # systemd's default: more than 5 starts in 10 s is a start-limit hit


def become_subreaper() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


@dataclass(frozen=True)
class Exit:
    name: str
    pid: int
    started_at: float
    ended_at: float
    returncode: int
    killed_by_run: bool  # the chaos (or the run's own stop) caused it
    said: str = ""  # the end of what this run of the process wrote (its log)

    @property
    def crashed(self) -> bool:
        """Not caused by the run, and ended by a traceback: a defect, not a clean refusal."""
        return not self.killed_by_run and "Traceback (most recent call last)" in self.said

    @property
    def how(self) -> str:
        if self.returncode < 0:
            return signal.Signals(-self.returncode).name
        return f"exit {self.returncode}"


@dataclass
class Supervised:
    """One service, restarted ``RESTART_S`` after every exit until the run stops it."""

    name: str
    argv: Sequence[str]
    env: Mapping[str, str]
    log_path: Path
    on_start: Callable[[int], None] = lambda pid: None
    process: Process | None = None
    started_at: float = 0.0
    exits: list[Exit] = field(default_factory=list)
    starts: list[float] = field(default_factory=list)
    _stopping: bool = False
    _killing: int | None = None
    _stopped: anyio.Event = field(default_factory=anyio.Event)

    @property
    def pid(self) -> int | None:
        process = self.process
        return process.pid if process is not None and process.returncode is None else None

    async def run(self) -> None:
        try:
            while not self._stopping:
                offset = self.log_path.stat().st_size if self.log_path.exists() else 0
                with self.log_path.open("ab") as out:
                    self.process = await anyio.open_process(
                        list(self.argv),
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=out,
                        env=dict(self.env),
                        start_new_session=True,
                    )
                self.started_at = time.time()
                self.starts.append(self.started_at)
                self.on_start(self.process.pid)
                code = await self.process.wait()
                pid = self.process.pid
                self.exits.append(
                    Exit(
                        self.name,
                        pid,
                        self.started_at,
                        time.time(),
                        code,
                        self._stopping or self._killing == pid,
                        _tail(self.log_path, offset),
                    )
                )
                if not self._stopping:
                    log.info("%s exited (%s); restarting in %.0f s", self.name, code, RESTART_S)
                    await anyio.sleep(RESTART_S)
        finally:
            # The run was cancelled (a Ctrl-C, a failure elsewhere): the process runs in a
            # session of its own, so nothing else would end it.
            with anyio.CancelScope(shield=True):
                await end_process(self.process)
            self._stopped.set()

    def kill(self) -> int | None:
        """SIGKILL the running process (the supervisor restarts it); its pid, or None."""
        pid = self.pid
        if pid is None:
            return None
        self._killing = pid
        os.kill(pid, signal.SIGKILL)
        return pid

    async def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM and wait (SIGKILL past ``timeout_s``); no restart after it."""
        self._stopping = True
        await end_process(self.process, timeout_s)
        with anyio.move_on_after(timeout_s):
            await self._stopped.wait()

    def unexpected_exits(self) -> list[Exit]:
        return [e for e in self.exits if not e.killed_by_run]

    def start_limit_hits(self) -> list[float]:
        """Times at which more than ``START_LIMIT[0]`` starts fell within ``START_LIMIT[1]`` s:
        systemd would have stopped restarting the service there (a crash loop)."""
        burst, window = START_LIMIT
        return [
            self.starts[i]
            for i in range(burst, len(self.starts))
            if self.starts[i] - self.starts[i - burst] < window
        ]


async def end_process(process: Process | None, timeout_s: float = 30.0) -> None:
    """SIGTERM ``process`` and wait for it; SIGKILL past ``timeout_s``."""
    if process is None or process.returncode is not None:
        return
    process.terminate()
    with anyio.move_on_after(timeout_s):
        await process.wait()
    if process.returncode is None:
        process.kill()
        await process.wait()


def _tail(path: Path, offset: int, limit: int = 16384) -> str:
    """What a process wrote to ``path`` from ``offset`` on, its last ``limit`` bytes."""
    try:
        with path.open("rb") as log_file:
            log_file.seek(max(offset, path.stat().st_size - limit))
            return log_file.read().decode(errors="replace")
    except OSError:
        return ""


# -- /proc -----------------------------------------------------------------------------------------


def rss_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def fd_count(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def parent_of(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ")".
    fields = stat.rpartition(")")[2].split()
    return int(fields[1]) if len(fields) > 1 else None


def state_of(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()
    return fields[0] if fields else None


def command_of(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()[:200]


def children_of(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and parent_of(int(entry)) == pid:
            found.append(int(entry))
    return found


def descendants_of(pid: int) -> list[int]:
    """Every live process below ``pid`` (children first)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            parent = parent_of(int(entry))
            if parent is not None:
                parents.setdefault(parent, []).append(int(entry))
    found: list[int] = []
    queue = [pid]
    while queue:
        for child in parents.get(queue.pop(0), []):
            found.append(child)
            queue.append(child)
    return found


def reap_orphans(known: set[int]) -> list[int]:
    """Collect the zombies re-parented to this process (the subreaper) that no one else waits
    for (``known``: the run's own children, which their owners wait for); their pids."""
    reaped = []
    for pid in children_of(os.getpid()):
        if pid in known or state_of(pid) != "Z":
            continue
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            continue
        reaped.append(pid)
    return reaped
