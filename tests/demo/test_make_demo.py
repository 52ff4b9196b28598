"""``make demo`` as a person uses it: the lines it prints say where the chat page is; the page, in
headless Chromium, shows a post, the answer as it streams, a stop (🛑), a reply answered and a
regenerate (🔁); loopd's status page is served; the demo's state starts anew with the fake's
world; a Ctrl-C ends it all, leaving no process and no socket file.

The model's work is bounded by tokens (``LOOPD_MAX_TOKENS``, greedy sampling: the tables run to
the limit, so the stop lands while the answer is written however fast the machine is); every
wait is for an event (a line in the output, a post on the page, a process gone), bounded
generously.
"""

from __future__ import annotations

import fcntl
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
from typing import Any

import httpx
import pytest

from loopd.chatsettings import ChatSettings
from tests import npm_cache
from tests.observe.real_stack import system_tool
from tests.screenshots import assert_drawn
from tests.terminal.test_make_run_tmux import processes_under

REPO = Path(__file__).parents[2]
WAIT_S = 600.0
PLAYWRIGHT = {"playwright-core": "1.65.1"}
# Greedy SmolLM2 writes these tables until the token limit; "Say hello." it answers in a line.
LONG = "@loopd Write the multiplication tables from 1 to 12."
SHORT = "Say hello."
MAX_TOKENS = 2000


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


def demo_env(state_dir: Path, **more: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOOPD_", "BROKERD_"))}
    env.update(LOOPD_STATE_DIR=str(state_dir), **more)
    return env


@pytest.fixture
def state_dir() -> Iterator[Path]:
    folder = Path(f"/tmp/loopd-demo-{uuid.uuid4().hex[:8]}")  # short: sockets live under it
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def in_chromium(script: str, profile: Path, url: str, **more: object) -> dict[str, Any]:
    """``js/<script>`` run on the page at ``url`` in Chromium (playwright-core, no browser of its
    own: the machine's Chromium, with a profile of the test's own); what it saw."""
    node = npm_cache.node("the demo page's tests")
    modules = npm_cache.node_modules(npm_cache.cache_dir("npm-playwright"), PLAYWRIGHT)
    arguments = {
        "modules": str(modules),
        "chromium": system_tool("chromium"),
        "profile": str(profile),
        "url": url,
        "wait_ms": int(WAIT_S * 1000),
        **more,
    }
    try:
        done = subprocess.run(
            [node, str(Path(__file__).parent / "js" / script), json.dumps(arguments)],
            capture_output=True,
            text=True,
            timeout=3 * WAIT_S,
            check=False,
        )
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    assert done.returncode == 0, done.stderr[-4000:]
    result: dict[str, Any] = json.loads(done.stdout)
    return result


@pytest.mark.real_server
@pytest.mark.slow
@pytest.mark.timeout(int(5 * WAIT_S))
def test_make_demo_page_in_chromium_post_stream_stop_regenerate(
    state_dir: Path, tmp_path: Path
) -> None:
    # What an earlier demo left: removed with the fake's world it answered.
    earlier = state_dir / "demo"
    earlier.mkdir(parents=True)
    (earlier / ".made-by-make-demo").touch()
    (earlier / "loopd.db").write_text("an earlier demo's sessions")
    port, status_port = free_port(), free_port()
    env = demo_env(
        state_dir,
        DEMO_MM_PORT=str(port),
        DEMO_STATUS_PORT=str(status_port),
        LOOPD_TEMPERATURE="0",
        LOOPD_MAX_TOKENS=str(MAX_TOKENS),
        LOOPD_THINK_CAP="0",
    )
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
    loopd_log = state_dir / "demo" / "run" / "loopd.log"
    try:
        wait_for(
            "loopd serve connected",
            lambda: loopd_log.exists() and "(new connection)" in loopd_log.read_text(),
            out,
            demo,
        )
        told = out.read_text()
        assert f"demo: open {base}/ in a browser" in told, told
        assert f"status page is http://127.0.0.1:{status_port}/" in told, told
        assert "curl" not in told, told
        assert not (state_dir / "demo" / "loopd.db").read_bytes().startswith(b"an earlier")

        shot = tmp_path / "demo.png"
        chat = ChatSettings()
        seen = in_chromium(
            "demo_page.cjs",
            state_dir.with_suffix(".chromium"),
            f"{base}/",
            screenshot=str(shot),
            prompts={"long": LONG, "short": SHORT},
            reactions={"stop": chat.stop_reaction, "regenerate": chat.retry_reaction},
            grown_chars=60,
        )

        welcome = str(seen["welcome"])
        assert {"✅", "❌", "🛑", "🔁"} <= set(welcome), welcome
        streamed = seen["streamed"]
        assert isinstance(streamed, list)
        before, grown = (str(text) for text in streamed)
        assert len(grown) > len(before), streamed
        thread = seen["thread"]
        assert isinstance(thread, list)
        people = [p for p in thread if p["kind"] == "person"]
        answers = [p for p in thread if p["kind"] == "answer"]
        assert [p["text"] for p in people] == [LONG, SHORT], thread
        assert len(answers) == 3, thread
        stopped, reply, again = answers
        assert stopped["text"].startswith(grown.removesuffix("…").rstrip()), thread
        assert "Stopped by @alice" in stopped["text"], thread
        assert stopped["reactions"] == ["🛑 alice"], thread
        assert reply["text"].strip(), thread
        assert not reply["text"].endswith("…"), thread
        assert reply["reactions"] == ["🔁 alice"], thread
        # The answer generated again, in a post of its own after the one reacted to.
        assert seen["regenerated"]["id"] == again["id"], seen["regenerated"]
        assert again["text"].strip(), thread
        assert not again["text"].endswith("…"), thread
        assert seen["threads"] == [f"{LONG.removeprefix('@loopd ')}4"], seen["threads"]
        assert_drawn(shot, least_height=900, least_width=1280)
        if keep := os.environ.get("LOOPDTEST_DEMO_PNG"):  # docs/demo.png is made so
            shutil.copy(shot, keep)

        status_page = httpx.get(f"http://127.0.0.1:{status_port}/", timeout=30)
        assert status_page.status_code == 200
        assert "<html" in status_page.text.lower()

        os.killpg(demo.pid, signal.SIGINT)  # the terminal's Ctrl-C, to the whole job
        # make itself dies of the SIGINT (a terminal's Ctrl-C reaches the whole job).
        assert demo.wait(timeout=120) in (0, 130, -signal.SIGINT), out.read_text()
        wait_for("every process gone", lambda: processes_under(state_dir) == [], out)
        assert [p for p in state_dir.rglob("*") if p.is_socket()] == []
        announced = json.loads((state_dir / "demo" / "run" / "mattermost.json").read_text())
        assert announced["base_url"] == base
    finally:
        if demo.poll() is None:
            # A Ctrl-C first, so that run.sh ends what it started in sessions of their own (the
            # page's process names no folder of this test's).
            os.killpg(demo.pid, signal.SIGINT)
            try:
                demo.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(demo.pid, signal.SIGKILL)
                demo.wait()
        for line in processes_under(state_dir):
            os.kill(int(line.split(":")[0]), signal.SIGKILL)
        out.unlink(missing_ok=True)


def run_demo_script(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """scripts/run.sh as ``make demo`` runs it, for the checks it makes before it starts
    anything."""
    return subprocess.run(
        [str(REPO / "scripts" / "run.sh")],
        env={**env, "DEMO": "1"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_make_demo_empties_only_a_folder_it_made(state_dir: Path) -> None:
    mine = state_dir / "demo"
    mine.mkdir(parents=True)
    (mine / "loopd.db").write_text("someone's sessions")
    done = run_demo_script(demo_env(state_dir))
    assert done.returncode == 2
    assert done.stderr == f"run: {mine} was not made by make demo; move it away first\n"
    assert (mine / "loopd.db").read_text() == "someone's sessions"


def test_a_second_make_demo_on_the_same_state_says_so(state_dir: Path) -> None:
    state_dir.mkdir()
    (state_dir / "demo").mkdir()
    (state_dir / "demo" / ".made-by-make-demo").touch()
    (state_dir / "demo" / "loopd.db").write_text("the running demo's sessions")
    with (state_dir / "demo.lock").open("w") as running:
        fcntl.flock(running, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as the running demo holds it
        done = run_demo_script(demo_env(state_dir))
    assert done.returncode == 2
    assert done.stderr == f"run: a demo is already running on {state_dir / 'demo'}\n"
    assert (state_dir / "demo" / "loopd.db").read_text() == "the running demo's sessions"


def test_the_page_keeps_a_post_the_server_failed_and_sends_it_once(tmp_path: Path) -> None:
    port = free_port()
    out = tmp_path / "demo.json"
    with out.open("w") as sink:
        page = subprocess.Popen(
            [str(REPO / ".venv" / "bin" / "python"), "-m", "loopd_dev.demo", "--port", str(port)],
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for("the page served", lambda: out.read_text().startswith("{"), out, page)
        seen = in_chromium("page_faults.cjs", tmp_path / "chromium", f"http://127.0.0.1:{port}/")
    finally:
        page.terminate()
        page.wait(timeout=60)
    assert seen["notice"].startswith("could not send: 503 "), seen
    assert seen["kept"] == "@loopd kept when refused"
    assert seen["notice_after"] is True
    assert seen["posts"] == ["@loopd kept when refused"]
    assert seen["threads"] == 1
