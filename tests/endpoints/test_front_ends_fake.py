"""``loopd chat`` and ``loopd run`` on two endpoints (fake llama-servers), run as the command line:
a session whose endpoint is down at start, or dies mid-turn, is answered on the other one with its
one ``endpoint lost`` re-read; with none up, one line and exit status 2. ``loopd serve``'s turns
take the same path (``Runtime.run_turn``), tested here too from the start it makes."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from loopd.config import load_settings
from loopd.endpoints.start import EXIT_NONE_UP, check_at_start, reachability_checker
from loopd.sessionlog.records import RequestKind, fresh_external_key
from loopd.sessionlog.verify import verify
from loopd.sessions import Runtime
from loopd_dev.fakes.llama import Trigger
from tests.terminal.support import FAKE_MODEL, LOOPD, FakeServer, fake_llama, requests, until
from tests.test_cli import run_loopd

NAMES = ("a", "b")


def _config(state: Path, urls: dict[str, str]) -> dict[str, str]:
    """The environment of a loopd process with one ``[[endpoint]]`` table per server."""
    tables = "".join(
        f'[[endpoint]]\nname = "{name}"\nurl = "{url}"\nmodel = "{FAKE_MODEL}"\nslots = [0, 1]\n\n'
        for name, url in urls.items()
    )
    path = state / "loopd.toml"
    state.mkdir(parents=True, exist_ok=True)
    path.write_text(tables, encoding="utf-8")
    # max_tokens well inside the fake's context, so no turn compacts first (and no thinking cap).
    return {
        "LOOPD_CONFIG": str(path),
        "LOOPD_STATE_DIR": str(state),
        "LOOPD_MAX_TOKENS": "512",
        "LOOPD_THINK_CAP": "0",
    }


@contextlib.contextmanager
def _two_fakes() -> Iterator[dict[str, FakeServer]]:
    with ExitStack() as stack:
        yield {name: stack.enter_context(fake_llama()) for name in NAMES}


def _kill(server: FakeServer) -> None:
    """The server dies: its listener and every connection closed, every request dropped."""
    die = server.fake.on_die
    assert die is not None
    server.portal.call(die)


def _turns(state: Path, session: str) -> list[tuple[object, str, str | None]]:
    """(endpoint, outcome, loss cause) of each of the session's turn requests."""
    return [
        (r.record.perf.extra.get("endpoint"), r.record.perf.outcome, r.record.perf.cache_loss_cause)
        for r in requests(state, session)
        if r.record.kind is RequestKind.TURN
    ]


def _chat(env: dict[str, str], session: str, text: str) -> subprocess.CompletedProcess[str]:
    return run_loopd(["chat", "--session", session], env, stdin=text + "\n")


def _ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    return result.stdout


def test_a_session_whose_endpoint_is_down_at_start_is_answered_on_the_other(
    tmp_path: Path,
) -> None:
    with _two_fakes() as fakes:
        env = _config(tmp_path, {name: fake.url for name, fake in fakes.items()})
        # Each session says its own words: the fake's cache would reuse another's same prompt.
        _ok(run_loopd(["run", "hello from r1", "--session", "r1"], env))
        _ok(_chat(env, "c1", "hello from c1"))
        assert [t[0] for t in _turns(tmp_path, "r1")] == ["a"]
        assert [t[0] for t in _turns(tmp_path, "c1")] == ["b"]  # the least loaded
        _ok(run_loopd(["run", "hello from r2", "--session", "r2"], env))
        _ok(_chat(env, "c2", "hello from c2"))
        assert [t[0] for t in _turns(tmp_path, "r2")] == ["a"]
        assert [t[0] for t in _turns(tmp_path, "c2")] == ["b"]

        _kill(fakes["a"])
        # Each front end's next turn, for a session placed on a and for one on b.
        assert _ok(run_loopd(["run", "again", "--session", "r1"], env)).strip()
        assert _ok(_chat(env, "r2", "again")).strip()
        assert _ok(run_loopd(["run", "again", "--session", "c1"], env)).strip()
        assert _ok(_chat(env, "c2", "again")).strip()
    for name in ("r1", "r2"):
        # Nothing was sent to a this time: the start found it down, and the session moved.
        assert _turns(tmp_path, name) == [
            ("a", "complete", "first request of the session"),
            ("b", "complete", "endpoint lost"),
        ], name
    for name in ("c1", "c2"):
        assert [t[:2] for t in _turns(tmp_path, name)] == [("b", "complete")] * 2, name
        assert "endpoint lost" not in {t[2] for t in _turns(tmp_path, name)}
    verified = run_loopd(["log", "verify"], env)
    assert verified.returncode == 0, verified.stdout + verified.stderr


@pytest.mark.parametrize("front_end", ["run", "chat"])
def test_a_server_that_dies_mid_turn_the_turn_is_answered_on_the_other(
    tmp_path: Path, front_end: str
) -> None:
    with _two_fakes() as fakes:
        env = _config(tmp_path, {name: fake.url for name, fake in fakes.items()})
        _ok(run_loopd(["run", "hello", "--session", "s1"], env))
        assert [t[0] for t in _turns(tmp_path, "s1")] == ["a"]
        fakes["a"].faults(stall_mid_stream=Trigger(after=1))  # its stream begins, then stalls
        args = ["run", "a long story", "--session", "s1"]
        if front_end == "chat":
            args = ["chat", "--session", "s1"]
        with subprocess.Popen(
            [*LOOPD, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**_base_env(), **env},
        ) as child:
            try:
                if front_end == "chat":
                    assert child.stdin is not None
                    child.stdin.write("a long story\n")
                    child.stdin.flush()
                until(lambda: fakes["a"].chat_requests() == 2, "the turn's request on a", 60)
                _kill(fakes["a"])
                out, err = child.communicate(timeout=120)
            finally:
                if child.poll() is None:
                    child.kill()
        assert child.returncode == 0, err
        assert out.strip()
    turns = _turns(tmp_path, "s1")
    assert turns[0][0] == "a"
    assert turns[-1] == ("b", "complete", "endpoint lost")
    assert {t[:2] for t in turns[1:-1]} == {("a", "broken")}, turns
    assert run_loopd(["log", "verify"], env).returncode == 0


def _base_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("LOOPD_")}


@pytest.mark.parametrize("front_end", ["run", "chat"])
def test_with_no_endpoint_up_one_line_and_exit_2(tmp_path: Path, front_end: str) -> None:
    env = _config(tmp_path, {name: f"unix:{tmp_path}/{name}.sock" for name in NAMES})
    args = ["run", "hello"] if front_end == "run" else ["chat", "--session", "s1"]
    result = run_loopd(args, env, stdin="hello\n")
    assert result.returncode == EXIT_NONE_UP
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("loopd: no endpoint is up (a: unreachable ("), lines
    assert "; b: unreachable (" in lines[0]


# -- loopd serve: its turns take the same path, from the start it makes --------------------------


@pytest.mark.anyio
async def test_serve_moves_a_session_whose_endpoint_was_down_at_start(tmp_path: Path) -> None:
    with _two_fakes() as fakes:
        tables = [
            {"name": name, "url": fake.url, "model": FAKE_MODEL, "slots": (0, 1)}
            for name, fake in fakes.items()
        ]
        settings = load_settings(endpoint=tables, state_dir=tmp_path, max_tokens=64, think_cap=0)
        runtime = Runtime.open(settings)
        try:
            await _serve_turn(runtime, "s1")
        finally:
            await runtime.aclose()
        _kill(fakes["a"])
        runtime = Runtime.open(settings)  # loopd serve started again, a gone
        try:
            assert runtime.endpoints is not None
            # As run_daemon starts: every endpoint checked at once, the ones down marked so.
            check = reachability_checker(runtime.endpoints.clients())
            checks = await check_at_start(settings.endpoints(), check)
            assert list(checks.down) == ["a"]
            runtime.endpoints.start(check, checks.down)
            await _serve_turn(runtime, "s1")
            assert verify(runtime.log) == []
        finally:
            await runtime.aclose()
    assert _turns(tmp_path, "s1") == [
        ("a", "complete", "first request of the session"),
        ("b", "complete", "endpoint lost"),
    ]


async def _serve_turn(runtime: Runtime, name: str) -> None:
    session = runtime.ensure_session(name)
    runtime.log.append_user(name, "hello", external_key=fresh_external_key())
    outcome = await runtime.run_turn(session, lambda status: None)
    assert outcome.answer is not None, outcome.failure
