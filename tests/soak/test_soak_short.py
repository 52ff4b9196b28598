"""The soak's short version (about 60 s, 10 threads, durable sessions on) under the same
invariants as ``make soak``: the whole stack as separate processes on the REAL llama-server,
every fault kind fired (the model child's kill and the whole server's restart among them), at
least 50 tool calls, nothing lost, nothing answered twice, no tool run twice, and the returns
after a server kill that had lost enough to be worth a restore restored from disk.

It starts a router of its own (the run kills it, and its model child), so it does not use the shared
``real_server`` fixture; a missing server fails it with the command to run.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from soak.plan import FaultKind

pytestmark = [pytest.mark.real_server, pytest.mark.timeout(1200)]

REPO_ROOT = Path(__file__).resolve().parents[2]
FIGURES = re.compile(
    r"^soak (?P<verdict>PASS|FAIL): messages lost (?P<lost>\d+), answered twice (?P<twice>\d+), "
    r"tools run twice (?P<tools_twice>\d+), turns (?P<turns>\d+), faults injected (?P<faults>\d+) "
    r"\(seed \d+, 60 s, 10 threads, (?P<calls>\d+) tool calls\); durable sessions "
    r"(?P<durable>on|off): (?P<returns>\d+) returns after (?P<kills>\d+) server kills, "
    r"(?P<worth>\d+) worth restoring, (?P<restored>\d+) restored from disk, re-read "
    r"(?P<reread>\d+) prompt tokens "
    r"\(ideal (?P<ideal>\d+)\)$"
)


def test_the_short_soak_holds_every_invariant(tmp_path: Path) -> None:
    doc = tmp_path / "soak.md"
    argv = [sys.executable, "-m", "soak", "--seconds", "60", "--threads", "10"]
    # A minute holds few turns on a loaded machine: users are quicker, tool messages ask for more.
    # The wait for the last turns is longer than the load: a shared machine may lend it little.
    argv += ["--calls", "8-12", "--think", "8", "--patience", "20-45", "--settle", "600"]
    # Durable sessions on (the run with them off, beside it, is make soak's): the model child's
    # kill is among the faults, and the run fails if no session came back restored from disk.
    argv += ["--durable", "on", "--doc", str(doc)]
    run = subprocess.run(
        argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=1100, check=False
    )
    said = run.stdout + run.stderr
    last = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else ""
    match = FIGURES.match(last)
    assert match is not None, f"no figures line (exit {run.returncode}):\n{said[-4000:]}"
    assert run.returncode == 0, said[-4000:]
    assert match["verdict"] == "PASS"
    assert (match["lost"], match["twice"], match["tools_twice"]) == ("0", "0", "0")
    assert int(match["calls"]) >= 50
    assert int(match["faults"]) >= len(FaultKind)  # one of each kind at least
    assert int(match["turns"]) > 0
    assert match["durable"] == "on"
    assert int(match["kills"]) >= 1
    if int(match["worth"]):
        assert int(match["restored"]) >= 1
    report = doc.read_text()
    assert "**Result: PASS**" in report
    assert (tmp_path / "soak.png").read_bytes().startswith(b"\x89PNG")
