"""``make demo`` as its first lines say to use it: the fake Mattermost, the embedded server,
brokerd and ``loopd serve`` come up; a post as alice in ~dev (the printed curl command) gets an
answer in its thread; a Ctrl-C ends it all, leaving no process and no socket file.

The model's work is bounded by tokens (``LOOPD_MAX_TOKENS``); every wait is for an event (a line
in the output, an answer in the fake's log, a process gone), bounded generously.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.terminal.test_make_run_tmux import processes_under

REPO = Path(__file__).parents[2]
WAIT_S = 600.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def wait_for(
    what: str, found: Callable[[], bool], output: Path, demo: subprocess.Popen[bytes] | None = None
) -> None:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if found():
            return
        if demo is not None and demo.poll() is not None:
            break  # make demo ended: what it printed says why
        time.sleep(0.25)
    pytest.fail(f"never happened: {what}\n--- make demo ---\n{output.read_text()[-4000:]}")


@pytest.fixture
def state_dir() -> Iterator[Path]:
    folder = Path(f"/tmp/loopd-demo-{uuid.uuid4().hex[:8]}")  # short: sockets live under it
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.real_server
@pytest.mark.slow
@pytest.mark.timeout(int(3 * WAIT_S))
def test_make_demo_answers_a_post_and_ctrl_c_leaves_nothing(state_dir: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOOPD_", "BROKERD_"))}
    env.update(
        LOOPD_STATE_DIR=str(state_dir),
        DEMO_MM_PORT=str(port),
        LOOPD_MAX_TOKENS="24",
        LOOPD_THINK_CAP="0",
    )
    if "LOOPDEV_CACHE_DIR" in os.environ:
        env["LOOPDEV_CACHE_DIR"] = os.environ["LOOPDEV_CACHE_DIR"]
    out = state_dir.with_suffix(".out")
    with out.open("w") as sink:
        demo = subprocess.Popen(
            ["make", "-C", str(REPO), "demo"],
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a process group of its own, as a terminal's job is
        )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for("loopd serve connected", lambda: "(new connection)" in out.read_text(), out, demo)
        told = out.read_text()
        assert f"curl -s {base}/_fake/act/post_as" in told
        post = {"username": "alice", "channel": "dev", "message": "@loopd Say hello."}
        root = httpx.post(f"{base}/_fake/act/post_as", json=post, timeout=30).json()["result"]

        def answered() -> bool:
            log = httpx.get(f"{base}/_fake/log", timeout=30).json()
            return any(
                p["root_id"] == root["id"]
                and p["user_id"] != root["user_id"]
                and p["message"].strip()
                and not p["message"].startswith(("⏳", "✍️", "🤔"))
                and not p["message"].endswith("…")  # still streaming
                for p in log
            )

        wait_for("an answer in the thread", answered, out, demo)
        os.killpg(demo.pid, signal.SIGINT)  # the terminal's Ctrl-C, to the whole job
        # make itself dies of the SIGINT (a terminal's Ctrl-C reaches the whole job).
        assert demo.wait(timeout=120) in (0, 130, -signal.SIGINT), out.read_text()
        wait_for("every process gone", lambda: processes_under(state_dir) == [], out)
        assert [p for p in state_dir.rglob("*") if p.is_socket()] == []
        assert json.loads((state_dir / "run" / "mattermost.json").read_text())["base_url"] == base
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
            demo.wait()
        for line in processes_under(state_dir):
            os.kill(int(line.split(":")[0]), signal.SIGKILL)
        out.unlink(missing_ok=True)
