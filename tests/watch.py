"""Watching a bound while a scenario runs: a process's peak resident memory, and the longest its
event loop went without running (a heartbeat task).

A bound on memory or on the event loop is checked by watching it, not by reading the code:

- ``Heartbeat`` is a task that wakes every ``period_s``; the longest it waited past that is the
  event loop's longest stall (a synchronous read, a render, a parse that held the loop);
- ``run_watched("module:function", *args)`` runs the async ``function(*args)`` in a fresh Python
  process under a heartbeat, and returns what it returned with the child's peak resident memory
  (its ``VmHWM`` as it ends: the kernel's high-water mark of the program's own memory, which,
  unlike ``ru_maxrss``, does not carry the parent's size over from before the ``exec``), its
  resident memory just before the scenario began (after its imports), and the longest stall.
  The child is killed at ``timeout_s``, pass or fail;
- ``peak_rss(pid)`` reads a running process's peak (``VmHWM``), for a daemon a test started
  (brokerd), and ``Watched.line`` says it all in one line for the test's output.

``python -m tests.watch module:function ARG...`` is the child's side.
"""

from __future__ import annotations

import importlib
import json
import os
import resource
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import anyio
from anyio.abc import TaskStatus

REPO_ROOT: Final = Path(__file__).parents[1]
MIB: Final = 1024 * 1024
HEARTBEAT_S: Final = 0.005
_MARK: Final = "tests.watch result: "


class Heartbeat:
    """A task that wakes every ``period_s``: ``longest_stall_s`` is the longest it woke late."""

    def __init__(self, period_s: float = HEARTBEAT_S) -> None:
        self.period_s = period_s
        self.longest_stall_s = 0.0
        self.beats = 0
        self._last = time.monotonic()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Beat until cancelled; started (``tg.start``) once the first beat's clock runs, so a
        stall right after the start is seen."""
        self._last = time.monotonic()
        task_status.started()
        try:
            while True:
                await anyio.sleep(self.period_s)
                self._beat()
        finally:  # a stall just before the end has kept the last beat waiting: it counts too
            self._beat(counted=False)

    def _beat(self, *, counted: bool = True) -> None:
        now = time.monotonic()
        self.longest_stall_s = max(self.longest_stall_s, now - self._last - self.period_s)
        self.beats += counted
        self._last = now


async def under_heartbeat(work: Awaitable[Any], period_s: float = HEARTBEAT_S) -> tuple[Any, float]:
    """``work``'s result, and the longest stall of the loop it ran on."""
    beat = Heartbeat(period_s)
    async with anyio.create_task_group() as tg:
        await tg.start(beat.run)
        result = await work
        tg.cancel_scope.cancel()
    return result, beat.longest_stall_s


def rss_now(pid: int | str = "self") -> int:
    """A process's resident memory now (``VmRSS``), in bytes."""
    return _status_field(pid, "VmRSS:")


def peak_rss(pid: int | str = "self") -> int:
    """A process's peak resident memory so far (``VmHWM``), in bytes."""
    return _status_field(pid, "VmHWM:")


def _status_field(pid: int | str, name: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(name):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {name} line in /proc/{pid}/status")


@dataclass(frozen=True)
class Watched:
    """A scenario run in a child process, and what it cost."""

    result: Any  # what the scenario returned (JSON)
    peak_rss: int  # bytes, the child's peak over its whole life (from its exec on)
    rss_before: int  # bytes, when the scenario began (its imports done)
    longest_stall_s: float
    output: str = ""  # what the child wrote, stdout and stderr together

    @property
    def growth(self) -> int:
        """How far the scenario took the child's memory past where it began."""
        return max(self.peak_rss - self.rss_before, 0)

    @property
    def line(self) -> str:
        return (
            f"peak RSS {self.peak_rss / MIB:.0f} MiB (+{self.growth / MIB:.0f} MiB in the "
            f"scenario), longest event-loop stall {self.longest_stall_s * 1000:.0f} ms"
        )


def run_watched(scenario: str, *args: str, timeout_s: float = 120.0) -> Watched:
    """Run ``scenario`` (``"module:function"``, an async function of string arguments that
    returns JSON) in a fresh Python process, under a heartbeat; what it returned and cost.
    ``AssertionError`` with its output when it fails or outlives ``timeout_s``."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.watch", scenario, *args],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    watchdog = threading.Timer(timeout_s, process.kill)
    watchdog.start()
    try:
        assert process.stdout is not None
        with process.stdout:
            output = process.stdout.read().decode("utf-8", "replace")
        process.wait()
    finally:
        watchdog.cancel()
        if process.returncode is None:
            process.kill()
            process.wait()
    marked = [line for line in output.splitlines() if line.startswith(_MARK)]
    if process.returncode != 0 or not marked:
        raise AssertionError(f"{scenario} exited {process.returncode}:\n{output[-4000:]}")
    report = json.loads(marked[-1][len(_MARK) :])
    return Watched(
        result=report["result"],
        peak_rss=report["peak_rss"],
        rss_before=report["rss_before"],
        longest_stall_s=report["longest_stall_s"],
        output="".join(line for line in output.splitlines(True) if not line.startswith(_MARK)),
    )


def _scenario(name: str) -> Callable[..., Awaitable[Any]]:
    module, _, function = name.partition(":")
    found: Callable[..., Awaitable[Any]] = getattr(importlib.import_module(module), function)
    return found


async def _child(name: str, args: list[str]) -> None:
    scenario = _scenario(name)
    rss_before = rss_now()
    result, stall = await under_heartbeat(scenario(*args))
    report = {
        "result": result,
        "rss_before": rss_before,
        "peak_rss": peak_rss(),
        "longest_stall_s": stall,
    }
    print(_MARK + json.dumps(report), flush=True)


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m tests.watch module:function [ARG...]", file=sys.stderr)
        return 2
    from loopcommon import anyio_unix_connect

    anyio_unix_connect.apply()
    anyio.run(_child, argv[0], argv[1:])
    return 0


if __name__ == "__main__":
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a killed child leaves no core file
    sys.exit(main(sys.argv[1:]))
