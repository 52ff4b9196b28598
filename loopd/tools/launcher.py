"""The small program between loopd and a command: limits, and a whole-tree kill.

loopd runs ``python -I -S launcher.py LIMITS LOOPD_PID -- ARGV...`` (``LIMITS`` is
``CommandLimits.to_json``; ``ARGV`` is bubblewrap or the shell). It imports only the standard
library, so it starts in a few milliseconds and needs nothing of loopd's environment. It

- makes itself a child subreaper, so every process the command leaves behind (a ``setsid``
  daemon, a double fork) is re-parented to it instead of escaping to init;
- forks the command and, in the child only, sets the resource limits (memory, file size, CPU
  time, processes, no core files) and joins the pids cgroup when loopd made one, then execs;
- when the command ends, or when loopd sends SIGTERM (the timeout, a cancelled turn) or dies
  (``PR_SET_PDEATHSIG``), kills every descendant it still has and exits the way the command did
  (the same exit code or signal), and removes the pids cgroup loopd made for it, if any.

``RLIMIT_NPROC`` counts every process and thread of the user, not of one command, so the limit is
set to what the user runs now plus the command's allowance. The kernel ignores it for root; there
loopd passes a pids cgroup instead, where it can make one (see ``pidscgroup``).
"""

import ctypes
import json
import os
import resource
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import suppress
from dataclasses import asdict, dataclass

_PR_SET_PDEATHSIG = 1
_PR_SET_DUMPABLE = 4
_PR_SET_CHILD_SUBREAPER = 36
_CANNOT_START = 127
_RMDIR_TRIES = 50
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@dataclass(frozen=True)
class CommandLimits:
    """What one command may take; ``pids_cgroup`` is a directory made for this command, or None."""

    memory_bytes: int
    file_bytes: int
    processes: int
    cpu_s: int
    pids_cgroup: str | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "CommandLimits":
        return cls(**json.loads(text))


# --- pure decisions ----------------------------------------------------------------------------


def rlimits(limits: CommandLimits, user_tasks: int) -> dict[int, tuple[int, int]]:
    """The resource limits of the command, soft and hard, given the user's tasks now."""
    nproc = user_tasks + limits.processes
    return {
        resource.RLIMIT_DATA: (limits.memory_bytes, limits.memory_bytes),
        resource.RLIMIT_FSIZE: (limits.file_bytes, limits.file_bytes),
        # SIGXCPU at the soft limit, SIGKILL a second later for a process that catches it.
        resource.RLIMIT_CPU: (limits.cpu_s, limits.cpu_s + 1),
        resource.RLIMIT_NPROC: (nproc, nproc),
        resource.RLIMIT_CORE: (0, 0),
    }


def lowered(wanted: tuple[int, int], current: tuple[int, int]) -> tuple[int, int]:
    """``wanted``, but never above a hard limit already in force (only root may raise it)."""
    hard = current[1]
    if hard == resource.RLIM_INFINITY:
        return wanted
    return min(wanted[0], hard), min(wanted[1], hard)


def parse_stat(text: str) -> tuple[int, int]:
    """(pid, parent pid) from the text of ``/proc/PID/stat``; the name may hold ``)``."""
    pid, _, rest = text.partition(" (")
    fields = rest.rpartition(")")[2].split()
    return int(pid), int(fields[1])


def descendants(parents: dict[int, int], root: int) -> set[int]:
    """Every process below ``root`` in a pid -> parent pid map."""
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    found: set[int] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def split_argv(argv: Sequence[str]) -> tuple[CommandLimits, int, list[str]]:
    """The limits, loopd's pid and the command, from ``LIMITS LOOPD_PID -- ARGV...``."""
    if len(argv) < 4 or argv[2] != "--" or not argv[1].isdigit():
        raise SystemExit("usage: launcher.py LIMITS LOOPD_PID -- ARGV...")
    return CommandLimits.from_json(argv[0]), int(argv[1]), list(argv[3:])


# --- reading /proc -----------------------------------------------------------------------------


def _pids() -> Iterator[int]:
    for name in os.listdir("/proc"):
        if name.isdigit():
            yield int(name)


def process_parents() -> dict[int, int]:
    parents = {}
    for pid in _pids():
        try:
            with open(f"/proc/{pid}/stat") as stat:
                parents[pid] = parse_stat(stat.read())[1]
        except (OSError, ValueError, IndexError):
            continue  # gone since the listing
    return parents


def user_tasks(uid: int) -> int:
    """Processes and threads of ``uid`` (what ``RLIMIT_NPROC`` counts) that /proc shows."""
    total = 0
    for pid in _pids():
        try:
            with open(f"/proc/{pid}/status") as status:
                fields = dict(line.split(":", 1) for line in status if ":" in line)
        except OSError:
            continue
        if int(fields.get("Uid", "-1 ").split()[0]) == uid:
            total += int(fields.get("Threads", "1"))
    return total


# --- the launcher ------------------------------------------------------------------------------


class _Stop(Exception):
    """loopd asked for the command to end (timeout or cancel)."""


def _stop(signum: int, frame: object) -> None:
    raise _Stop


def _prctl(option: int, value: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}) failed")


def kill_tree() -> None:
    """Kill every descendant, round after round until none is left (a fork may race a round)."""
    me = os.getpid()
    while True:
        for pid in descendants(process_parents(), me):
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        try:
            reaped = _reap_dead_children()
        except ChildProcessError:
            return  # no child at all: nothing is left below us
        if not reaped:
            time.sleep(0.005)  # killed ones not dead yet; let them go before the next round


def _reap_dead_children() -> bool:
    """Reap every dead child; the children of a killed process are re-parented to us."""
    reaped = False
    while os.waitpid(-1, os.WNOHANG)[0]:
        reaped = True
    return reaped


def _start(argv: list[str], limits: CommandLimits) -> int:
    uid = os.getuid()
    tasks = user_tasks(uid) if uid != 0 else 0
    pid = os.fork()
    if pid:
        return pid
    # The command's process, until exec: nothing here may return into the launcher's code.
    try:
        for signum in _STOP_SIGNALS:
            signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, set())
        if limits.pids_cgroup is not None:
            with open(os.path.join(limits.pids_cgroup, "cgroup.procs"), "w") as procs:
                procs.write(str(os.getpid()))
        for kind, value in rlimits(limits, tasks).items():
            resource.setrlimit(kind, lowered(value, resource.getrlimit(kind)))
    except BaseException as exc:
        _cannot_start(f"its limits could not be set: {exc}")
    try:
        os.execv(argv[0], argv)
    except BaseException as exc:
        _cannot_start(f"{argv[0]}: {exc.strerror if isinstance(exc, OSError) else exc}")
    os._exit(_CANNOT_START)


def _cannot_start(why: str) -> None:
    os.write(2, f"run_command: the command could not be started: {why}\n".encode())
    os._exit(_CANNOT_START)


def _wait_for(pid: int) -> int:
    """Reap children (orphans included) until ``pid`` ends; its wait status."""
    while True:
        done, status = os.waitpid(-1, 0)
        if done == pid:
            return status


def _exit_as(status: int) -> None:
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        # No core file of the launcher, whatever the signal's default action.
        _prctl(_PR_SET_DUMPABLE, 0)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})
        os.kill(os.getpid(), signum)
        os._exit(128 + signum)  # a signal that does not end a process by default
    os._exit(os.waitstatus_to_exitcode(status))


def main(argv: Sequence[str]) -> None:
    limits, loopd_pid, command = split_argv(argv)
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    signal.pthread_sigmask(signal.SIG_BLOCK, set(_STOP_SIGNALS))
    for signum in _STOP_SIGNALS:
        signal.signal(signum, _stop)
    # A command does not outlive loopd (SIGKILLed, say); checked after, since loopd may be gone.
    _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != loopd_pid:
        _end(limits)
        os._exit(128 + signal.SIGTERM)
    try:
        pid = _start(command, limits)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, set(_STOP_SIGNALS))
        status = _wait_for(pid)
    except _Stop:
        _end(limits)
        os._exit(128 + signal.SIGTERM)
    _end(limits)
    _exit_as(status)


def _end(limits: CommandLimits) -> None:
    """Kill what is left, and remove the command's cgroup: loopd may be gone and cannot."""
    signal.pthread_sigmask(signal.SIG_BLOCK, set(_STOP_SIGNALS))
    kill_tree()
    if limits.pids_cgroup is not None:
        for _ in range(_RMDIR_TRIES):  # a task just reaped may hold it for a moment
            try:
                os.rmdir(limits.pids_cgroup)
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.01)
            else:
                return


if __name__ == "__main__":
    main(sys.argv[1:])
