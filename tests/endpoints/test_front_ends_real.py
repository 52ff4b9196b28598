"""Two real llama-servers and the terminal front ends, run as the command line: four sessions
spread by ``loopd chat`` (piped input), one server killed (SIGKILL to its process group, as a
crashed box goes), and each session's next ``loopd chat`` and ``loopd run`` answered on the other
server; the killed server's sessions with one ``endpoint lost`` re-read each, as ``loopd perf
--json`` shows, and ``loopd log verify`` clean."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from loopd_dev import devserver

pytestmark = pytest.mark.real_server

NAMES = ("a", "b")
SESSIONS = ("s1", "s2", "s3", "s4")


@pytest.fixture
def servers() -> Iterator[dict[str, devserver.RunningServer]]:
    """Two routers of their own, each on a Unix socket in its own folder (short paths)."""
    with tempfile.TemporaryDirectory(prefix="lfe") as tmp:
        running: dict[str, devserver.RunningServer] = {}
        try:
            for name in NAMES:
                folder = Path(tmp) / name
                running[name] = devserver.start(
                    folder, devserver.default_cache_dir(), socket_path=folder / "llama.sock"
                )
            yield running
        except devserver.DevServerError as exc:
            pytest.fail(f"the real llama-server is required and could not start: {exc}")
        finally:
            for server in running.values():
                server.stop()


def _env(state: Path, servers: dict[str, devserver.RunningServer]) -> dict[str, str]:
    tables = "".join(
        f'[[endpoint]]\nname = "{name}"\nurl = "{server.url}"\n'
        f'model = "{devserver.PLAIN_MODEL}"\nslots = [0, 1]\n\n'
        for name, server in servers.items()
    )
    config = state / "loopd.toml"
    config.write_text(tables, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPD_")}
    # The model's work is bounded by max_tokens; temperature 0 keeps it the same on every run.
    env.update(
        LOOPD_CONFIG=str(config),
        LOOPD_STATE_DIR=str(state),
        LOOPD_MAX_TOKENS="16",
        LOOPD_THINK_CAP="0",
        LOOPD_TEMPERATURE="0",
    )
    return env


def _loopd(env: dict[str, str], *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "loopd", *args],
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _answered(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip(), result.stderr  # an answer was written


def _turns(perf: list[dict[str, object]], session: str) -> list[tuple[object, ...]]:
    return [
        (r["endpoint"], r["outcome"], r["cache_loss_cause"])
        for r in perf
        if r["session"] == session and r["kind"] == "turn"
    ]


@pytest.mark.timeout(900)
def test_chat_and_run_answer_a_killed_servers_sessions_on_the_other(
    servers: dict[str, devserver.RunningServer], tmp_path: Path
) -> None:
    env = _env(tmp_path, servers)
    for name in SESSIONS:
        _answered(_loopd(env, "chat", "--session", name, stdin=f"Say hello to {name}.\n"))
    listed = _loopd(env, "sessions")
    rows = [line.split()[:2] for line in listed.stdout.splitlines()[1:]]
    assert rows == [["s1", "a"], ["s2", "b"], ["s3", "a"], ["s4", "b"]], listed.stdout

    servers["a"].kill()  # returns once the router has exited
    for name in SESSIONS:
        _answered(_loopd(env, "chat", "--session", name, stdin="Name a colour.\n"))
        _answered(_loopd(env, "run", "Name a fruit.", "--session", name))

    verified = _loopd(env, "log", "verify")
    print(verified.stdout)  # what it says, for the record
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert verified.stdout.endswith("4 session(s), hash chain and replay identity hold\n")
    perf_json = _loopd(env, "perf", "--json")
    assert perf_json.returncode == 0, perf_json.stderr
    perf = json.loads(perf_json.stdout)
    lost = [r for r in perf if r["cache_loss_cause"] == "endpoint lost"]
    print(json.dumps(lost, indent=1))
    # One re-read each for a's sessions, on b; nothing sent to a after it died (each run's start
    # found it down), and b's own sessions never re-read.
    assert sorted((r["session"], r["endpoint"]) for r in lost) == [("s1", "b"), ("s3", "b")]
    assert all(isinstance(r["cache_loss"], int) and r["cache_loss"] > 0 for r in lost), lost
    for name in ("s1", "s3"):
        assert _turns(perf, name) == [
            ("a", "complete", "first request of the session"),
            ("b", "complete", "endpoint lost"),
            ("b", "complete", None),
        ], name
    for name in ("s2", "s4"):
        assert [t[:2] for t in _turns(perf, name)] == [("b", "complete")] * 3, name
        assert "endpoint lost" not in {t[2] for t in _turns(perf, name)}, name
    table = _loopd(env, "perf", "--session", "s1")
    print(table.stdout)
    assert "requests by server: a 1, b 2" in table.stdout
    assert "unexplained" not in _loopd(env, "perf").stdout
