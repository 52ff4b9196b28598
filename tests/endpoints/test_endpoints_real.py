"""Two real llama-servers on loopback: sessions spread across both; one server killed mid-session
(SIGKILL to its process group, as a crashed box goes): its sessions go on on the other with one
full re-read each, recorded as ``endpoint lost``, the log verifies and no message is lost or
answered twice; the server started again passes its re-check and new sessions reach it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from loopd.config import load_settings
from loopd.sessionlog.records import RequestKind, fresh_external_key
from loopd.sessionlog.verify import verify
from loopd.sessions import Runtime
from loopd_dev import devserver

pytestmark = [pytest.mark.anyio, pytest.mark.real_server]

NAMES = ("a", "b")


def _start(workdir: Path) -> devserver.RunningServer:
    try:
        return devserver.start(
            workdir, devserver.default_cache_dir(), socket_path=workdir / "llama.sock"
        )
    except devserver.DevServerError as exc:
        pytest.fail(f"the real llama-server is required and could not start: {exc}")


@pytest.fixture
def servers() -> Iterator[dict[str, devserver.RunningServer]]:
    """Two routers of their own, each on a Unix socket in its own folder (short paths)."""
    with tempfile.TemporaryDirectory(prefix="lep") as tmp:
        running: dict[str, devserver.RunningServer] = {}
        try:
            for name in NAMES:
                running[name] = _start(Path(tmp) / name)
            yield running
        finally:
            for server in running.values():
                server.stop()


def _runtime(servers: dict[str, devserver.RunningServer], state: Path) -> Runtime:
    tables = [
        {"name": name, "url": server.url, "model": devserver.PLAIN_MODEL, "slots": (0, 1)}
        for name, server in servers.items()
    ]
    settings = load_settings(
        endpoint=tables, state_dir=state, temperature=0.0, max_tokens=16, think_cap=0
    )
    return Runtime.open(settings)


async def _turn(runtime: Runtime, name: str, text: str) -> None:
    session = runtime.ensure_session(name)
    runtime.log.append_user(name, text, external_key=fresh_external_key())
    outcome = await runtime.run_turn(session, lambda status: None)
    assert outcome.answer is not None, outcome.failure


def _roles(runtime: Runtime, name: str) -> list[str]:
    """The session's conversation as stored, past the system message: user, assistant, ..."""
    return [json.loads(m)["role"] for m in runtime.log.replay_messages(name)[1:]]


def _turn_requests(runtime: Runtime, name: str) -> list[tuple[str | None, str, str | None]]:
    """(endpoint, outcome, loss cause) of each of the session's turn requests, in order."""
    return [
        (r.record.perf.extra.get("endpoint"), r.record.perf.outcome, r.record.perf.cache_loss_cause)
        for r in runtime.log.requests(name)
        if r.record.kind is RequestKind.TURN
    ]


@pytest.mark.timeout(900)
async def test_sessions_spread_survive_a_killed_server_and_reach_it_again(
    servers: dict[str, devserver.RunningServer], tmp_path: Path
) -> None:
    runtime = _runtime(servers, tmp_path)
    came_up = anyio.Event()
    assert runtime.endpoints is not None
    runtime.endpoints.on_up(lambda name: came_up.set())
    first = ("s1", "s2", "s3", "s4")
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(runtime.keep_warm)  # re-checks the down endpoints
            for name in first:
                await _turn(runtime, name, f"Say hello to {name}.")
            placed = {name: where for name, (where, _) in runtime.log.last_endpoints().items()}
            assert placed == {"s1": "a", "s2": "b", "s3": "a", "s4": "b"}

            servers["a"].kill()
            for name in first:
                await _turn(runtime, name, "Name a colour.")
                await _turn(runtime, name, "Name a fruit.")

            # a's sessions: one broken request (s1's, that found a dead), then one re-read on b
            # recorded as "endpoint lost", then b's cache serves the next one.
            for name in ("s1", "s3"):
                after_kill = [r for r in _turn_requests(runtime, name)[1:] if r[1] == "complete"]
                assert after_kill == [("b", "complete", "endpoint lost"), ("b", "complete", None)]
            lost = [
                r.record.perf
                for name in first
                for r in runtime.log.requests(name)
                if r.record.perf.cache_loss_cause == "endpoint lost"
            ]
            assert len(lost) == 2, lost
            assert all(p.cache_loss for p in lost), lost
            for name in ("s2", "s4"):
                assert [r[0] for r in _turn_requests(runtime, name)] == ["b", "b", "b"]
            broken = [
                r for name in first for r in _turn_requests(runtime, name) if r[1] != "complete"
            ]
            assert {r[0] for r in broken} == {"a"}, broken

            servers["a"] = _start(servers["a"].workdir)
            with anyio.fail_after(300):
                await came_up.wait()
            await _turn(runtime, "s5", "Say hello to s5.")
            assert runtime.log.last_endpoints()["s5"][0] == "a"
            tg.cancel_scope.cancel()

        assert verify(runtime.log) == []
        for name in first:  # every message answered once, none lost
            assert _roles(runtime, name) == ["user", "assistant"] * 3, name
            assert not runtime.log.state(name).pending_turn
        assert _roles(runtime, "s5") == ["user", "assistant"]
    finally:
        await runtime.aclose()
    verified, listed = _loopd(tmp_path, "log", "verify"), _loopd(tmp_path, "sessions")
    print(verified.stdout, listed.stdout, sep="")  # what the commands say, for the record
    assert verified.returncode == 0, verified.stderr
    assert verified.stdout.endswith("5 session(s), hash chain and replay identity hold\n")
    rows = [line.split()[:2] for line in listed.stdout.splitlines()[1:]]
    assert rows == [["s1", "b"], ["s2", "b"], ["s3", "b"], ["s4", "b"], ["s5", "a"]]


def _loopd(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The ``loopd`` command line on the test's state folder."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPD_")}
    env["LOOPD_STATE_DIR"] = str(state)
    return subprocess.run(
        [sys.executable, "-m", "loopd", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
