"""The loopd command line as a user runs it: a subprocess, its exit status, its stderr."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from loopd.config import NO_MODEL
from loopd_dev import devserver

LOOPD = [sys.executable, "-m", "loopd"]


def run_loopd(
    args: list[str], env: dict[str, str], stdin: str = "", timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPD_")}
    full_env.update(env)
    return subprocess.run(
        [*LOOPD, *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
        check=False,
    )


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://127.0.0.1:1", "unreachable"),
        ("unix:/nonexistent/llama.sock", "No such file"),
        ("htp://typo", "must start with"),
    ],
)
def test_bad_server_url_gives_one_line_and_exit_2(tmp_path: Path, url: str, says: str) -> None:
    result = run_loopd(
        ["chat", "--session", "x"],
        {"LOOPD_INFER_URL": url, "LOOPD_MODEL": "m", "LOOPD_STATE_DIR": str(tmp_path)},
        stdin="hello\n",
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert url in lines[0] or "LOOPD_INFER_URL" in lines[0]
    assert says in lines[0]
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


def test_a_server_without_a_named_model_gives_one_line_and_exit_2(tmp_path: Path) -> None:
    result = run_loopd(["chat", "--session", "x"], {"LOOPD_STATE_DIR": str(tmp_path)}, "hello\n")
    assert result.returncode == 2
    assert result.stderr == f"loopd: {NO_MODEL}\n"
    assert result.stdout == ""


@pytest.mark.real_server
def test_chat_answers_each_line_then_resumes_the_log(
    real_server: devserver.RunningServer, tmp_path: Path
) -> None:
    env = {
        "LOOPD_INFER_URL": real_server.url,
        "LOOPD_MODEL": devserver.PLAIN_MODEL,
        "LOOPD_STATE_DIR": str(tmp_path),
        "LOOPD_SLOTS": "1",
        "LOOPD_TEMPERATURE": "0",
        "LOOPD_MAX_TOKENS": "40",
        "LOOPD_THINK_CAP": "0",
    }
    first = run_loopd(["chat", "--session", "smoke"], env, stdin="Say hello.\nAnd again.\n")
    assert first.returncode == 0, first.stderr
    answers = [line for line in first.stdout.splitlines() if line.strip()]
    assert len(answers) >= 2
    requests = [line for line in first.stderr.splitlines() if '"model request"' in line]
    assert len(requests) == 2, "one JSON log line per model request"
    verify = run_loopd(["log", "verify", "smoke"], env)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    sessions = run_loopd(["sessions"], env)
    assert "smoke" in sessions.stdout
    assert "answered" in sessions.stdout


@pytest.mark.real_server
def test_stopped_server_mid_session_fails_the_turn_with_exit_2(tmp_path: Path) -> None:
    """A server that goes away between turns: the piped chat ends with one clear line."""
    workdir = tmp_path / "server"
    server = devserver.start(
        workdir,
        devserver.default_cache_dir(),
        socket_path=workdir / "llama.sock",
    )
    server.stop()
    result = run_loopd(
        ["chat", "--session", "gone"],
        {
            "LOOPD_INFER_URL": server.url,
            "LOOPD_MODEL": devserver.PLAIN_MODEL,
            "LOOPD_STATE_DIR": str(tmp_path / "state"),
        },
        stdin="hello\n",
    )
    assert result.returncode == 2
    assert server.url in result.stderr
    assert "Traceback" not in result.stderr


def test_serve_refuses_to_start_when_the_self_test_fails(tmp_path: Path) -> None:
    result = run_loopd(
        ["serve"],
        {
            "LOOPD_INFER_URL": "http://127.0.0.1:1",
            "LOOPD_MODEL": "m",
            "LOOPD_STATE_DIR": str(tmp_path),
            "LOOPD_MM_URL": "http://127.0.0.1:2",
        },
    )
    assert result.returncode == 2
    assert "FAIL  server: expected healthy" in result.stderr
    assert "refusing to start: the self-test failed" in result.stderr
    assert "Traceback" not in result.stderr
