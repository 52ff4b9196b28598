"""``LOOPD_DURABLE=auto`` in ``loopd chat`` goes by what ``loopd selftest --record`` stored, as a
new user runs it: the real router with ``--slot-save-path``, its answers recorded, three terminal
sessions with the default settings, the server killed and started again, and each session's next
message re-reads under a tenth of its prompt (its save restored). Run as the command line; model
work is bounded by ``max_tokens``."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from loopd.engine.cacheloss import LossCause
from loopd.sessionlog.records import Request, RequestKind
from loopd.sessionlog.store import SessionLog
from loopd_dev import devserver
from tests.durable.test_durable_endpoints_real import MOST_REREAD, SECOND, first, reread
from tests.durable.test_durable_real import Restartable
from tests.endpoints.test_front_ends_real import _loopd as loopd

pytestmark = pytest.mark.real_server

SESSIONS = ("north", "south", "east")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Restartable]:
    running = Restartable(tmp_path / "server", devserver.PLAIN_MODEL)
    running.start()
    try:
        yield running
    finally:
        running.stop()


def chat(env: dict[str, str], expected: Path, session: str, text: str) -> None:
    said = loopd(env, "chat", "--session", session, "--expected-dir", str(expected), stdin=text)
    assert said.returncode == 0, said.stderr
    assert said.stdout.strip(), said.stderr  # an answer was written


def after_restart(db: Path, session: str, before: int) -> list[Request]:
    with SessionLog.open(db) as log:
        return log.requests(session)[before:]


def test_selftest_record_then_chat_sessions_come_back_from_a_restart(
    server: Restartable, tmp_path: Path
) -> None:
    state, expected = tmp_path / "state", tmp_path / "expected"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPD_")}
    # The defaults otherwise (LOOPD_DURABLE and LOOPD_PIN_SLOTS auto); the work bounded.
    env.update(
        LOOPD_INFER_URL=server.url,
        LOOPD_MODEL=server.model,
        LOOPD_STATE_DIR=str(state),
        LOOPD_MAX_TOKENS="16",
        LOOPD_THINK_CAP="0",
        LOOPD_TEMPERATURE="0",
    )
    recorded = loopd(env, "selftest", "--record", "--expected-dir", str(expected))
    assert recorded.returncode == 0, recorded.stdout + recorded.stderr
    print(next(line for line in recorded.stdout.splitlines() if "durable sessions" in line))
    written = json.loads((expected / f"{server.model}.json").read_text(encoding="utf-8"))
    assert written["durable_available"] is True
    for name in SESSIONS:
        chat(env, expected, name, first(name) + "\n")
    with SessionLog.open(state / "loopd.db") as log:
        counts = {name: len(log.requests(name)) for name in SESSIONS}
        assert all(
            [r.record.kind for r in log.requests(name)] == [RequestKind.TURN, RequestKind.PREWARM]
            for name in SESSIONS
        ), "each answered turn was saved (the read before the save is the prewarm)"
    server.kill()
    server.start()
    for name in SESSIONS:
        chat(env, expected, name, SECOND + "\n")
    total_read = total_prompt = 0
    for name in SESSIONS:
        requests = after_restart(state / "loopd.db", name, counts[name])
        read, prompt = reread(requests)
        total_read, total_prompt = total_read + read, total_prompt + prompt
        print(f"{name}: re-read {read} of {prompt} prompt tokens after the restart")
        assert read < MOST_REREAD * prompt, (name, read, prompt)
        answered = next(r for r in requests if r.record.perf.outcome == "complete")
        assert answered.record.perf.cache_loss_cause == LossCause.RESTORED.value
    print(f"three sessions: re-read {total_read} of {total_prompt} prompt tokens")
