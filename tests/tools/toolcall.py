"""Driving ``loopd tools call`` as an operator does (a state directory, sessions, a subprocess),
and the attack programs the tools and security tests share."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loopd.sessionlog.store import SessionLog
from loopd.tools.command import LAUNCHER
from loopd.tools.launcher import CommandLimits

LOOPD = [sys.executable, "-m", "loopd"]

FORK_BOMB = """
import os, time
made = 0
try:
    while made < 300:
        if os.fork() == 0:
            time.sleep(120)
            os._exit(0)
        made += 1
except OSError as exc:
    print("fork refused:", exc.strerror)
print("made", made)
"""
"""Forks children that wait, until a fork fails or 300 run; prints how many it made."""


# Above the accounts and the subordinate ranges a system gives out, and under 2**31 with any pid
# (bubblewrap refuses a larger uid when it maps its user namespace).
OWN_UID_BASE = 1_000_000_000


def as_nobody(argv: list[str]) -> list[str]:
    """``argv`` run as nobody when the tests run as root (the kernel exempts root from much, and
    loopd's deployment runs as an ordinary user)."""
    if os.geteuid() != 0:
        return argv
    return ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *argv]


def as_user_of_its_own(argv: list[str]) -> list[str]:
    """``argv`` run as a user no other process runs as, when the tests run as root.

    For a limit the kernel counts per user (``RLIMIT_NPROC``): nobody's processes are anyone's,
    and a second ``make test`` beside this one runs its fork bombs as nobody at the same moment,
    taking the room this one's limit left (seen: "made 0"). The uid is this test process's own
    and has no account: the kernel needs none."""
    if os.geteuid() != 0:
        return argv
    uid = OWN_UID_BASE + os.getpid()
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *argv]


@contextmanager
def open_folder(prefix: str) -> Iterator[Path]:
    """A folder an unprivileged user can reach and write (pytest's base is private to root)."""
    place = Path(tempfile.mkdtemp(prefix=prefix))
    place.chmod(0o777)
    try:
        yield place.resolve()
    finally:
        shutil.rmtree(place, ignore_errors=True)


def standalone_launcher(place: Path, limits: CommandLimits, command: Sequence[str]) -> list[str]:
    """``command`` behind loopd's launcher as run_command starts it, for another user: the
    launcher stands alone, copied to ``place`` and run by the system's Python (the checkout and
    the test's interpreter may live where nobody cannot read). This process stands for loopd."""
    launcher = place / "launcher.py"
    shutil.copyfile(LAUNCHER, launcher)
    argv = ["/usr/bin/python3", "-I", "-S", str(launcher), limits.to_json(), str(os.getpid())]
    return [*argv, "--", *command]


def processes_with(marker: str) -> list[int]:
    """Live ``sleep MARKER`` processes (not those that only name it in a longer argument, such as
    loopd's or the shell's; a zombie has no command line)."""
    wanted = f"sleep\0{marker}\0".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "cmdline").read_bytes() == wanted:
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def unique_sleep() -> str:
    """A sleep length no other process uses, so the processes sleeping it can be found."""
    return f"{1000 + uuid.uuid4().int % 1000}.{uuid.uuid4().int % 10**6:06}"


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 30) -> None:
    """Poll ``condition`` until it holds (an event in another process), failing after a while."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"still waiting for {what} after {timeout_s:g} s")
        time.sleep(0.05)


def kill_all(marker: str) -> None:
    for pid in processes_with(marker):
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@dataclass(frozen=True)
class Called:
    """One ``loopd tools call`` run: its exit status, output and how long it took."""

    returncode: int
    stdout: str
    stderr: str
    seconds: float


@dataclass
class LoopdBox:
    """A loopd state directory with sessions, and the environment its commands run with."""

    root: Path
    env: dict[str, str] = field(default_factory=dict)

    @property
    def state_dir(self) -> Path:
        return self.root / "state"

    @property
    def workspaces(self) -> Path:
        return self.state_dir / "workspaces"

    def add_sessions(self, *names: str) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        with SessionLog.open(self.state_dir / "loopd.db") as log:
            for name in names:
                log.ensure_session(name, 0)

    def entry_count(self, session: str) -> int:
        with SessionLog.open(self.state_dir / "loopd.db", create=False) as log:
            return len(log.entries(session))

    def call(
        self,
        name: str,
        session: str,
        arguments: dict[str, Any] | str,
        *,
        timeout: float = 120,
        env: dict[str, str] | None = None,
    ) -> Called:
        text = arguments if isinstance(arguments, str) else json.dumps(arguments)
        return self.run(["tools", "call", name, "--session", session, text], timeout, env)

    def run(
        self, args: list[str], timeout: float = 120, env: dict[str, str] | None = None
    ) -> Called:
        """``loopd ARGS...`` with this box's state directory; nothing of the caller's LOOPD_*."""
        started = time.monotonic()
        done = subprocess.run(
            [*LOOPD, *args],
            capture_output=True,
            text=True,
            env=self.full_env(env),
            timeout=timeout,
            check=False,
        )
        return Called(done.returncode, done.stdout, done.stderr, time.monotonic() - started)

    def start(self, args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        """``loopd ARGS...`` started, not waited for (its output is discarded)."""
        return subprocess.Popen(
            [*LOOPD, *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            text=True,
            env=self.full_env(env),
        )

    def full_env(self, env: dict[str, str] | None) -> dict[str, str]:
        full = {k: v for k, v in os.environ.items() if not k.startswith("LOOPD_")}
        # A runtime names its server's model, though a tool call sends no request.
        full.update(LOOPD_STATE_DIR=str(self.state_dir), LOOPD_MODEL="m", LOOPD_LOG_FORMAT="json")
        full.update(self.env)
        full.update(env or {})
        return full


def without_bwrap(tmp_path: Path) -> str:
    """A PATH on which loopd finds no bubblewrap (its own Python is found by absolute path)."""
    empty = tmp_path / "empty-path"
    empty.mkdir(exist_ok=True)
    return str(empty)
