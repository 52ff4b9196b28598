"""A stop signal ends a soak run and everything it started: Ctrl-C (SIGINT) or SIGTERM while the
stack runs (the router, brokerd, loopd serve, the fake Mattermost) ends every one of those
processes, keeps the work folder, writes no report and exits with 128 plus the signal's number.

It starts a router of its own, as the short soak does; a missing server fails it with the command
to run.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from soak.procs import descendants_of, state_of

pytestmark = [pytest.mark.real_server, pytest.mark.timeout(600)]

REPO_ROOT = Path(__file__).resolve().parents[2]


def alive(pid: int) -> bool:
    return state_of(pid) not in (None, "Z")


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_signal_ends_the_run_and_every_process_it_started(
    tmp_path: Path, stop: signal.Signals
) -> None:
    doc = tmp_path / "soak.md"
    argv = [sys.executable, "-m", "soak", "--seconds", "60", "--threads", "1"]
    argv += ["--durable", "on", "--doc", str(doc)]
    said: list[str] = []
    started: list[int] = []
    with subprocess.Popen(
        argv, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as run:
        try:
            assert run.stdout is not None
            for line in run.stdout:  # the load starts once the whole stack is up
                said.append(line)
                if line.startswith("soak: load for"):
                    started = descendants_of(run.pid)
                    break
            assert started, "".join(said[-40:])
            os.kill(run.pid, stop)
            said += run.stdout.readlines()
            code = run.wait()
        finally:
            if run.poll() is None:
                run.kill()
    text = "".join(said)
    assert code == 128 + stop.value, text[-4000:]
    assert f"soak: stopped by {stop.name}; every process the run started has ended" in text
    kept = [line.split(": ", 2)[2] for line in said if "the work folder is kept" in line]
    assert kept, text[-4000:]
    assert [pid for pid in started if alive(pid)] == []
    assert not doc.exists()
    shutil.rmtree(kept[0].strip(), ignore_errors=True)
