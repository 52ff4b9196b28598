"""``loopd perf``: the records as JSON with the server's field names, and the readable summary."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from loopcommon.jsonbytes import dumps
from loopd.cli import perf as perf_command
from loopd.cli.parser import build_parser
from loopd.engine.cacheloss import LossCause
from loopd.observe import perfsummary
from loopd.sessionlog.chain import messages_digest
from loopd.sessionlog.records import Perf, RequestKind, RequestRecord
from loopd.sessionlog.store import SessionLog
from tests.engine.engine_support import SESSION, SLOT, open_log, say

ANSWER = dumps({"role": "assistant", "content": "ok"})
# The wait a person saw before the first turn's first token, in its parts.
WAITED = {
    "loopd_queue_ms": 3100.0,
    "server_queue_ms": 30.0,
    "prompt_read_ms": 1200.0,
    "first_token_ms": 70.0,
}


def _record(log: SessionLog, kind: RequestKind, **perf: Any) -> RequestRecord:
    messages = log.replay_messages(SESSION)
    return RequestRecord(
        kind=kind,
        slot=SLOT,
        epoch=log.current_epoch(SESSION).number,
        message_count=len(messages),
        messages_sha256=messages_digest(messages),
        perf=Perf(**perf),
    )


def _answer(log: SessionLog, kind: RequestKind = RequestKind.TURN, **perf: Any) -> None:
    log.append_assistant(SESSION, ANSWER, request=_record(log, kind, outcome="complete", **perf))


def _break(log: SessionLog, **perf: Any) -> None:
    record = _record(log, RequestKind.TURN, outcome="broken", **perf)
    log.append_broken(SESSION, partial_text="", reason="dropped", request=record)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """Two turns: the first retried once after a 500; the second capped, then a cold re-read."""
    with open_log(tmp_path) as log:
        say(log, "one")
        _break(log, extra={"failure": "rejected", "status_code": 500, "detail": "answered 500"})
        _answer(
            log,
            cache_n=0,
            prompt_n=200,
            predicted_n=20,
            ttfb_ms=30.5,
            capped=True,
            queue_wait_ms=30.0,
            extra=WAITED,
        )
        say(log, "two")
        _answer(
            log,
            cache_n=2,
            prompt_n=300,
            predicted_n=10,
            cache_loss=217,
            cache_loss_cause=LossCause.COLD.value,
            extra={"expected_reuse": 219},
        )
        log.record_request(SESSION, _record(log, RequestKind.SELFTEST, cache_n=9, prompt_n=9))
    return tmp_path / "loopd.db"


def _run(db: Path, *argv: str) -> tuple[int, str, str]:
    args = build_parser().parse_args(["perf", *argv])
    out, err = io.StringIO(), io.StringIO()
    code = perf_command.run(args, db, out, err)
    return code, out.getvalue(), err.getvalue()


def test_json_lists_every_request_with_the_servers_field_names(db: Path) -> None:
    code, out, err = _run(db, "--session", SESSION, "--json")
    assert (code, err) == (0, "")
    records = json.loads(out)
    assert [(r["kind"], r["outcome"]) for r in records] == [
        ("turn", "broken"),
        ("turn", "complete"),
        ("turn", "complete"),
        ("selftest", "ok"),
    ]
    retried, capped, cold, _ = records
    assert (retried["failure"], retried["status_code"], retried["cache_n"]) == (
        "rejected",
        500,
        None,
    )
    assert {k: capped[k] for k in ("cache_n", "prompt_n", "predicted_n", "ttfb_ms", "capped")} == {
        "cache_n": 0,
        "prompt_n": 200,
        "predicted_n": 20,
        "ttfb_ms": 30.5,
        "capped": True,
    }
    assert (cold["cache_loss"], cold["cache_loss_cause"], cold["expected_reuse"]) == (
        217,
        "cold server or eviction",
        219,
    )
    assert {r["session"] for r in records} == {SESSION}
    assert {r["slot"] for r in records} == {SLOT}
    assert {r["epoch"] for r in records} == {1}
    for name in ("queue_wait_ms", "prompt_per_second", "predicted_per_second", "thinking_tokens"):
        assert name in capped


def test_summary_shows_hit_rate_recompute_per_turn_and_losses_by_cause(db: Path) -> None:
    code, out, _ = _run(db)
    assert code == 0
    assert out.splitlines() == [
        f"session {SESSION}: 2 turns, 4 requests to the model",
        "  wait for the first token: p50 4.4 s, p95 4.4 s (1 turn)",
        "    of which in loopd's queue p50 3.1 s, p95 3.1 s; in the server's queue p50 30 ms, "
        "p95 30 ms; reading the prompt p50 1.2 s, p95 1.2 s; the first token p50 70 ms, p95 70 ms",
        "  prompt cache: 0.4% reused (2 of 502 prompt tokens); 250 tokens read per turn",
        "  requests: 3 for a message, 1 self-test; 1 failed, 1 cut at the thinking cap",
        "  prompt tokens read per request: p50 200, p95 300 (2 requests)",
        "  prompt tokens read again, by cause:",
        "    the server had forgotten it (restarted, or another model ran): 1 request, 217 tokens",
    ]
    # Words a person reads, not loopd's own (a request's kind, a slot, an epoch, "broken").
    for word in ("broken", "slot", "epoch", "selftest", "tool_followup", "prompt_n"):
        assert word not in out


def test_every_session_s_summary_leads_then_a_line_per_session(db: Path) -> None:
    with SessionLog.open(db) as log:
        log.ensure_session("other", SLOT)
    code, out, _ = _run(db)
    assert code == 0
    lines = out.splitlines()
    # The whole first, the wait people saw first of all; then one line per session.
    assert lines[:2] == [
        "all sessions: 2 turns, 4 requests to the model",
        "  wait for the first token: p50 4.4 s, p95 4.4 s (1 turn)",
    ]
    assert lines[-3:] == [
        "SESSION   TURNS   WAIT p50   WAIT p95  REUSED  FAILED",
        f"{SESSION}      2      4.4 s      4.4 s    0.4%       1",
        "other         0          -          -       -       0",
    ]


def test_summary_figures_from_requests() -> None:
    summary = perfsummary.summarize([])
    assert (summary.requests, summary.hit_rate, summary.recompute_per_turn) == (0, None, None)
    assert perfsummary.format_summary("empty", summary).splitlines() == [
        "empty: 0 turns, 0 requests to the model",
        "  requests: none; none failed",
        "  prompt tokens read again: none",
    ]


def test_an_unknown_session_is_one_clear_line_and_a_missing_log_is_empty(
    db: Path, tmp_path: Path
) -> None:
    code, out, err = _run(db, "--session", "nobody", "--json")
    assert (code, out) == (2, "")
    assert err == f"loopd: perf: session log {db}: no session 'nobody'\n"
    missing = tmp_path / "none.db"
    assert _run(missing) == (0, f"no sessions in {missing}\n", "")
    assert _run(missing, "--json") == (0, "[]\n", "")
    code, _, err = _run(missing, "--session", "nobody")
    assert code == 2
    assert err == f"loopd: perf: session log {missing}: no session 'nobody'\n"
    assert not missing.exists(), "reading perf never creates a log"


def test_summary_counts_the_returns_durable_sessions_made(tmp_path: Path) -> None:
    """A restore is counted even where it left nothing to re-read; a refused one is a loss."""
    with open_log(tmp_path) as log:
        say(log, "one")
        _answer(log, cache_n=0, prompt_n=300, predicted_n=20)
        say(log, "two")
        _answer(log, cache_n=319, prompt_n=9, cache_loss=0, cache_loss_cause="restored from disk")
        say(log, "three")
        _answer(log, cache_n=0, prompt_n=340, cache_loss=337, cache_loss_cause="restore refused")
    code, out, _ = _run(tmp_path / "loopd.db", "--session", SESSION)
    assert code == 0, out
    assert (
        "returns after the server lost a session: 1 put back from disk, "
        "1 putting it back from disk was refused"
    ) in out
    assert "    putting it back from disk was refused: 1 request, 337 tokens" in out
