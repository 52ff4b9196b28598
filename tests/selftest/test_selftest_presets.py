"""``loopd selftest`` passes on every preset of the router ``make run`` starts (each has its
recorded expectations in ``loopd/data/expected/``), run as a person runs it: the command, one
model at a time, against the router on its socket.

A preset added to the dev server without its expectations fails here, naming the command that
records them.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from loopd.selftest.expected import expectation_path
from loopd_dev import devserver

REPO = Path(__file__).parents[2]
LOOPD = REPO / ".venv" / "bin" / "loopd"


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[devserver.RunningServer]:
    """The router as ``make run`` starts it (``python -m loopd_dev.devserver``: the default
    layout and presets), of this module's own: the presets load in turn, and the session's
    shared router keeps its two models."""
    workdir = tmp_path_factory.mktemp("presets")
    with devserver.running(
        workdir, devserver.default_cache_dir(), socket_path=workdir / "llama.sock", load=()
    ) as server:
        yield server


def presets(server: devserver.RunningServer) -> list[str]:
    """The model ids of the router's preset file (``[*]`` holds the flags they share)."""
    text = (server.workdir / "models.ini").read_text()
    return [name for name in re.findall(r"^\[([^\]]+)\]$", text, re.M) if name != "*"]


@pytest.mark.real_server
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_selftest_passes_on_every_preset_make_run_serves(
    router: devserver.RunningServer, tmp_path: Path
) -> None:
    models = presets(router)
    assert devserver.PLAIN_MODEL in models
    assert devserver.TOOL_MODEL in models
    unrecorded = [m for m in models if not expectation_path(m).exists()]
    assert unrecorded == [], (
        f"no expectations recorded for {unrecorded}: start the router "
        "(python -m loopd_dev.devserver --socket S) and run "
        "LOOPD_INFER_URL=unix:S LOOPD_MODEL=<model> loopd selftest --record"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPD_")}
    env.update(LOOPD_INFER_URL=router.url, LOOPD_STATE_DIR=str(tmp_path / "state"))
    failed = {}
    for model in models:
        done = subprocess.run(
            [str(LOOPD), "selftest"],
            env={**env, "LOOPD_MODEL": model},
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        verdict = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
        if done.returncode != 0 or not verdict.startswith("pass: "):
            failed[model] = f"exit {done.returncode}\n{done.stdout}{done.stderr}"
    assert failed == {}, "\n\n".join(f"== {m}\n{out}" for m, out in failed.items())
