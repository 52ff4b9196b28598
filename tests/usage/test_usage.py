"""Usage per person: real turns on the real llama-server in a terminal session, and a Mattermost
thread of two people written through the session log's own API with its label in the chat state,
read back by ``loopd usage`` (table and ``--json``) and by the metrics' collector."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from loopcommon.jsonbytes import dumps
from loopcommon.statuspage import ThreadView
from loopd.chat.cursor import ChatState
from loopd.sessionlog.chain import messages_digest
from loopd.sessionlog.records import Perf, RequestKind, RequestRecord
from loopd.sessionlog.store import SessionLog
from loopd.status.usage import UsageCollector
from loopd.terminal.link import local_user
from loopd.usage.ledger import (
    LOOPD_ITSELF,
    TERMINAL_CHANNEL,
    UsageKey,
    UsageTotals,
    day_of,
    session_ledger,
)
from loopd.usage.source import thread_labels
from loopd_dev import devserver
from tests.terminal.support import loopd_env
from tests.test_cli import run_loopd

THREAD = "mm:threadroot00000000000000"


def _record(prompt_n: int, predicted_n: int, kind: RequestKind = RequestKind.TURN) -> RequestRecord:
    perf = Perf(
        cache_n=100,
        prompt_n=prompt_n,
        predicted_n=predicted_n,
        extra={"prompt_ms": 250.0, "predicted_ms": 750.0},
    )
    return RequestRecord(kind, 0, 1, 1, messages_digest([]), perf)


def _answer(text: str) -> str:
    return dumps({"role": "assistant", "content": text})


def _write_thread(state: Path) -> None:
    """A thread alice started and bob followed, and a compaction recorded in bob's turn."""
    with SessionLog.open(state / "loopd.db") as log:
        log.ensure_session(THREAD, 0)
        log.start_epoch(THREAD, reason="new session", tools_text="[]", system_text="You help.")
        log.append_user(THREAD, "@alice: What is a slot?", external_key="p1")
        log.append_assistant(THREAD, _answer("A place."), request=_record(40, 10))
        log.append_user(THREAD, "@bob: And a prefix?", external_key="p2")
        log.record_request(THREAD, _record(7, 3, RequestKind.COMPACTION))
        log.append_assistant(THREAD, _answer("The start."), request=_record(20, 5))
    chat = ChatState.open(state / "chat.db")
    try:
        chat.label_thread(ThreadView("threadroot00000000000000", "~town-square", "alice", "What"))
    finally:
        chat.close()


def _rows(state: Path, *args: str) -> list[dict[str, object]]:
    result = run_loopd(["usage", "--json", *args], {"LOOPD_STATE_DIR": str(state)})
    assert result.returncode == 0, result.stderr
    rows: list[dict[str, object]] = json.loads(result.stdout)
    return rows


def test_a_thread_counts_each_turn_for_the_person_who_started_it(tmp_path: Path) -> None:
    _write_thread(tmp_path)
    rows = _rows(tmp_path)
    assert [(r["person"], r["channel"]) for r in rows] == [
        ("alice", "~town-square"),
        ("bob", "~town-square"),
    ]
    alice, bob = rows
    assert (alice["requests"], alice["prompt_tokens"], alice["generated_tokens"]) == (1, 40, 10)
    # bob's turn holds the compaction recorded after his message, and his answer.
    assert (bob["requests"], bob["prompt_tokens"], bob["generated_tokens"]) == (2, 27, 8)
    assert bob["cached_tokens"] == 200
    assert alice["gpu_seconds"] == 1.0
    assert bob["gpu_seconds"] == 2.0
    assert _rows(tmp_path, "--person", "bob") == [bob]
    assert _rows(tmp_path, "--since", "2999-01-01") == []

    table = run_loopd(["usage"], {"LOOPD_STATE_DIR": str(tmp_path)})
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == [
        "day", "person", "channel", "requests", "prompt", "cached", "generated", "GPU", "s"
    ]  # fmt: skip
    assert lines[-1].split() == ["total", "bob", "2", "27", "200", "8", "2.0"]


def test_the_metrics_carry_the_totals_per_person_and_channel(tmp_path: Path) -> None:
    _write_thread(tmp_path)
    registry = CollectorRegistry()
    with SessionLog.open(tmp_path / "loopd.db") as log:
        collector = UsageCollector(log, lambda: thread_labels(tmp_path), local_user())
        registry.register(collector)
        collector.refresh()
        first = generate_latest(registry).decode()
        log.append_user(THREAD, "@alice: Thanks!", external_key="p3")
        log.append_assistant(THREAD, _answer("Welcome."), request=_record(5, 2))
        collector.refresh()
        second = generate_latest(registry).decode()
    line = 'loopd_usage_prompt_tokens_total{channel="~town-square",person="%s"} %s'
    assert line % ("alice", "40.0") in first
    assert line % ("bob", "27.0") in first
    assert line % ("alice", "45.0") in second  # the new turn counted at the next scrape
    assert 'loopd_usage_gpu_seconds_total{channel="~town-square",person="bob"} 2.0' in second
    assert "_created" not in second


def test_loopds_own_requests_and_a_terminal_session(tmp_path: Path) -> None:
    """A prewarm before any message is loopd's own; a terminal session's turns are its person's,
    a tool round included; a day is the UTC date."""
    with SessionLog.open(tmp_path / "loopd.db") as log:
        log.ensure_session("desk", 0)
        log.start_epoch("desk", reason="new session", tools_text="[]", system_text="Hi.")
        log.record_request("desk", _record(50, 1, RequestKind.PREWARM))
        log.append_user("desk", "@mallory: not a post", external_key="k1")
        call = {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
            ],
        }
        log.append_assistant("desk", dumps(call), request=_record(30, 4))
        log.append_tool_result("desk", tool_call_id="c1", content="a.txt")
        followup = _record(6, 2, RequestKind.TOOL_FOLLOWUP)
        log.append_assistant("desk", _answer("One file."), request=followup)
        entries, requests = log.entries("desk"), log.requests("desk")
    ledger = session_ledger(entries, requests, channel=TERMINAL_CHANNEL, local_person="ann")
    day = day_of(requests[0].created_at)
    assert day == requests[0].created_at[:10]  # the log's clock is UTC
    assert ledger == {
        UsageKey(day, LOOPD_ITSELF, TERMINAL_CHANNEL): UsageTotals(1, 50, 100, 1, 1.0),
        UsageKey(day, "ann", TERMINAL_CHANNEL): UsageTotals(2, 36, 200, 6, 2.0),
    }
    assert day_of("2026-05-01T23:30:00-02:00") == "2026-05-02"


def test_no_log_is_no_usage(tmp_path: Path) -> None:
    result = run_loopd(["usage"], {"LOOPD_STATE_DIR": str(tmp_path)})
    assert (result.returncode, result.stdout) == (0, "no requests recorded\n")
    bad = run_loopd(["usage", "--since", "soon"], {"LOOPD_STATE_DIR": str(tmp_path)})
    assert bad.returncode == 2
    assert bad.stderr.startswith("loopd: usage: --since: 'soon' is neither")


@pytest.mark.real_server
def test_terminal_turns_count_for_the_local_user(
    real_server: devserver.RunningServer, tmp_path: Path
) -> None:
    env = loopd_env(real_server.url, tmp_path, max_tokens="16", temperature="0", think_cap="0")
    for session in ("first", "second"):
        ran = run_loopd(["run", "Say hello.", "--session", session], env)
        assert ran.returncode == 0, ran.stderr
    perf = run_loopd(["perf", "--json"], env)
    assert perf.returncode == 0, perf.stderr
    records = json.loads(perf.stdout)
    [row] = _rows(tmp_path)
    assert (row["person"], row["channel"]) == (local_user(), TERMINAL_CHANNEL)
    assert row["person"] != LOOPD_ITSELF
    assert row["requests"] == len(records) == 2
    assert row["prompt_tokens"] == sum(r["prompt_n"] for r in records) > 0
    assert row["generated_tokens"] == sum(r["predicted_n"] for r in records) > 0
    assert row["cached_tokens"] == sum(r["cache_n"] for r in records)
    assert isinstance(row["gpu_seconds"], float)
    assert row["gpu_seconds"] > 0
