"""Issue acceptance: a 5-turn `loopd chat` session on the real server reuses the whole previous
prompt on every request, read from the per-request records in the session log."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from loopd.sessionlog.records import RequestKind
from loopd.sessionlog.store import SessionLog
from loopd_dev import devserver
from tests.test_cli import run_loopd

pytestmark = pytest.mark.real_server

TURNS = ["Say hello.", "Name a colour.", "Name a fruit.", "Count to three.", "Say goodbye."]


def test_five_turn_chat_reuses_the_whole_previous_prompt(
    real_server: devserver.RunningServer, tmp_path: Path
) -> None:
    env = {
        "LOOPD_INFER_URL": real_server.url,
        "LOOPD_MODEL": devserver.PLAIN_MODEL,
        "LOOPD_STATE_DIR": str(tmp_path),
        "LOOPD_SLOTS": "0",
        "LOOPD_TEMPERATURE": "0",
        "LOOPD_MAX_TOKENS": "30",
        "LOOPD_THINK_CAP": "0",
    }
    result = run_loopd(["chat", "--session", "five"], env, stdin="\n".join(TURNS) + "\n")
    assert result.returncode == 0, result.stderr
    with SessionLog.open(tmp_path / "loopd.db", create=False) as log:
        requests = [r.record for r in log.requests("five")]
    assert [r.kind for r in requests] == [RequestKind.TURN] * 5
    perf = [r.perf for r in requests]
    for before, after in itertools.pairwise(perf):
        assert before.cache_n is not None
        assert before.prompt_n is not None
        assert after.cache_n is not None
        assert after.prompt_n is not None
        assert after.cache_n >= before.cache_n + before.prompt_n - 1, (before, after)
        assert after.cache_loss == 0
        # Only the new turn is processed: the user line and the template's few tokens around it.
        assert after.prompt_n < 30, after
    verify = run_loopd(["log", "verify"], env)
    assert verify.returncode == 0, verify.stdout + verify.stderr
