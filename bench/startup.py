"""The start-up section of ``make bench``: what a command costs before it does anything.

A person types ``loopd --version``, ``loopd --help`` or ``loopd run "..."`` and waits for the
interpreter to import what the command needs. Measured side by side in one run, each a fresh
process (the median of ``repeats`` runs, interleaved so that the machine's load falls on all
alike), CPU (user and system, from the kernel's accounting of the child) and wall time:

- ``python -c pass``: the interpreter alone, the floor;
- ``python -c "import httpx, anyio, pydantic"``: the libraries any such client starts with;
- ``llm --version``: a peer command line (Simon Willison's ``llm``, installed from PyPI into a
  scratch environment under the cache folder; where pip cannot install it the report says so);
- ``loopd --version`` and ``loopd --help``;
- ``loopd run hi`` until its request reaches the server: a relay in front of the fake
  llama-server notes the moment the chat request's first bytes arrive, and reads the loopd
  process's CPU then (``/proc/PID/task/*/schedstat``, in nanoseconds).

``tree`` runs the loopd of another checkout (its folder first on ``PYTHONPATH``: the recorded
"before" figures are the tree before this section's changes).
"""

from __future__ import annotations

import os
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from bench.errors import BenchError
from bench.scale import MODEL, fake_server

BIN = Path(sys.executable).parent
LLM_VERSION: Final = "0.36"  # the peer command line, pinned as loopd's own dependencies are
CHAT_REQUEST: Final = b"POST /v1/chat/completions "


@dataclass(frozen=True)
class Timed:
    cpu_ms: float
    wall_ms: float


def run_timed(
    argv: Sequence[str], env: Mapping[str, str], on_start: Callable[[int], None] = lambda pid: None
) -> Timed:
    """One run of ``argv``: its CPU (user and system, children included) and wall time;
    ``on_start`` is given its pid as it starts."""
    started = time.monotonic()
    child = subprocess.Popen(
        argv,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    on_start(child.pid)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.monotonic() - started
    child.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must know
    if child.returncode != 0:
        raise BenchError(f"{' '.join(argv)} exited {child.returncode}")
    return Timed((usage.ru_utime + usage.ru_stime) * 1000, wall * 1000)


def cpu_ns(pid: int) -> int:
    """The CPU time of every thread of ``pid`` so far, in nanoseconds (0 once it has ended)."""
    total = 0
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return 0
    for thread in threads:
        try:
            with open(f"/proc/{pid}/task/{thread}/schedstat") as stat:
                total += int(stat.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            continue  # the thread ended meanwhile
    return total


class RequestWatch:
    """A Unix-socket relay in front of the server that notes, for the process it watches, its
    CPU and the time when the first chat request's bytes come through."""

    def __init__(self, listen: Path, upstream: Path) -> None:
        self.upstream = upstream
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(str(listen))
        self._server.listen(16)
        self._pid = 0
        self._seen = threading.Event()
        self.cpu_ms = 0.0
        self.at = 0.0
        threading.Thread(target=self._accept, daemon=True).start()

    def watch(self, pid: int) -> None:
        self._pid, self.cpu_ms, self.at = pid, 0.0, 0.0
        self._seen.clear()

    def seen(self, timeout: float) -> bool:
        return self._seen.wait(timeout)

    def close(self) -> None:
        self._server.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return  # closed
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            upstream.connect(str(self.upstream))
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, from_client: bool) -> None:
        with source:
            while True:
                try:
                    data = source.recv(65536)
                except OSError:
                    data = b""
                if from_client and data.startswith(CHAT_REQUEST) and not self._seen.is_set():
                    self.cpu_ms, self.at = cpu_ns(self._pid) / 1e6, time.monotonic()
                    self._seen.set()
                if not data:
                    with suppress(OSError):
                        sink.shutdown(socket.SHUT_WR)
                    return
                try:
                    sink.sendall(data)
                except OSError:
                    return


def loopd_run(watch: RequestWatch, env: Mapping[str, str]) -> tuple[Timed, Timed]:
    """``loopd run hi``: CPU and wall time until its request reached the server, and in all."""
    started = time.monotonic()
    whole = run_timed([str(BIN / "loopd"), "run", "hi"], env, on_start=watch.watch)
    if not watch.seen(0):
        raise BenchError("loopd run ended without sending its request")
    return Timed(watch.cpu_ms, (watch.at - started) * 1000), whole


def llm_command(cache_dir: Path) -> list[str] | str:
    """``llm --version`` from a scratch environment (made once under ``cache_dir``), or why
    there is none."""
    venv = cache_dir / "bench" / f"llm-{LLM_VERSION}"
    script = venv / "bin" / "llm"
    if not script.exists():
        shutil.rmtree(venv, ignore_errors=True)
        made = subprocess.run(
            [sys.executable, "-m", "venv", str(venv)], capture_output=True, text=True, check=False
        )
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", f"llm=={LLM_VERSION}"]
        installed = made.returncode == 0 and (
            subprocess.run(pip, capture_output=True, text=True, check=False).returncode == 0
        )
        if not installed or not script.exists():
            shutil.rmtree(venv, ignore_errors=True)
            return f"llm {LLM_VERSION} could not be installed from PyPI here (pip failed)"
    return [str(script), "--version"]


def measure(
    work: Path, cache_dir: Path, repeats: int = 5, tree: Path | None = None, *, peer: bool = True
) -> dict[str, Any]:
    """The medians of ``repeats`` interleaved runs of each command (see the module's doc);
    ``peer`` False leaves ``llm`` out (nothing is installed)."""
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(work)}
    loopd_env = base | {
        "LOOPD_STATE_DIR": str(work / "state"),
        "LOOPD_MODEL": MODEL,
        "LOOPD_INFER_URL": f"unix:{work / 'watch.sock'}",
    }
    if tree is not None:
        loopd_env["PYTHONPATH"] = str(tree)
    python = str(BIN / "python")
    commands: dict[str, list[str]] = {
        "python -c pass": [python, "-c", "pass"],
        "import httpx, anyio, pydantic": [python, "-c", "import httpx, anyio, pydantic"],
    }
    llm = llm_command(cache_dir) if peer else "not asked for"
    if isinstance(llm, list):
        commands["llm --version"] = llm
    commands["loopd --version"] = [str(BIN / "loopd"), "--version"]
    commands["loopd --help"] = [str(BIN / "loopd"), "--help"]
    runs: dict[str, list[Timed]] = {name: [] for name in [*commands, "loopd run", "run total"]}
    with fake_server(work) as upstream:
        watch = RequestWatch(work / "watch.sock", upstream)
        try:
            for _ in range(repeats):
                for name, argv in commands.items():
                    env = loopd_env if name.startswith("loopd") else base
                    runs[name].append(run_timed(argv, env))
                to_request, whole = loopd_run(watch, loopd_env)
                runs["loopd run"].append(to_request)
                runs["run total"].append(whole)
        finally:
            watch.close()
    return {
        "tree": str(tree) if tree else "",
        "repeats": repeats,
        "llm": None if isinstance(llm, list) else llm,
        "rows": {
            name: {
                "cpu_ms": statistics.median(t.cpu_ms for t in timed),
                "wall_ms": statistics.median(t.wall_ms for t in timed),
            }
            for name, timed in runs.items()
        },
    }


# What each row is, in the report; the targets of the command line's own rows.
LABELS: Final = {
    "python -c pass": ("`python -c pass`", None),
    "import httpx, anyio, pydantic": ('`python -c "import httpx, anyio, pydantic"`', None),
    "llm --version": (f"`llm --version` (llm {LLM_VERSION}, a peer command line)", None),
    "loopd --version": ("`loopd --version`", 100.0),
    "loopd --help": ("`loopd --help`", 300.0),
    "loopd run": ("`loopd run hi`, until its request reaches the server", 500.0),
    "run total": ("`loopd run hi`, to its exit (the fake answers at once)", None),
}


def render(after: dict[str, Any], before: dict[str, Any] | None = None) -> list[str]:
    lines = [
        "### Start-up: a command's cost before it does anything",
        "",
        f"The median of {after['repeats']} interleaved runs of each command, each a fresh "
        "process: CPU (user and system, from the kernel's accounting) and wall time. `loopd run` "
        "runs against the fake llama-server; the moment its request reaches the server is seen "
        "by a relay in front of it, which reads loopd's CPU then.",
        "",
    ]
    if after["llm"]:
        lines += [f"`llm --version` is not measured: {after['llm']}.", ""]
    head = "| | target CPU ms | CPU ms | wall ms |"
    rule = "|---|---|---|---|"
    if before is not None:
        head += " CPU ms before | wall ms before |"
        rule += "---|---|"
    lines += [head, rule]
    for name, (label, target) in LABELS.items():
        row = after["rows"].get(name)
        if row is None:
            continue
        goal = f"< {target:,.0f}" if target else ""
        cells = [label, goal, _ms(row["cpu_ms"]), _ms(row["wall_ms"])]
        if before is not None:
            earlier = before["rows"].get(name)
            cells += [_ms(earlier["cpu_ms"]), _ms(earlier["wall_ms"])] if earlier else ["", ""]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _ms(value: float) -> str:
    return f"{value:,.0f}"
