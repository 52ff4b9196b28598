"""Writes the database fixtures of this folder: one file of each kind loopd and brokerd own.

The committed files were written by loopd 0.1.0, before versioned migrations for every file:
``python tests/data/db/write_fixtures.py tests/data/db`` at commit 40ebf3f, and at 7088691 for
``chat-0.1.0-held.db`` (that commit added the chat state's ``held`` table, still unversioned).
The tests copy them and open the copy with today's code, which must migrate it and read back
everything written here. Run with a later loopd this script writes that loopd's format instead,
so the committed files are never rewritten.
"""

import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from itertools import count
from pathlib import Path

from brokerd.tools.audit import AuditLog
from brokerd.tools.calls import CallRequest
from loopcommon import jsonbytes
from loopd.chat.cursor import ChatState
from loopd.sessionlog import (
    Perf,
    RequestKind,
    RequestRecord,
    SessionLog,
    messages_digest,
)

TOOLS_1 = '[{"type":"function","function":{"name":"read_file","parameters":{"type":"object"}}}]'
TOOLS_2 = (
    '[{"type":"function","function":{"name":"read_file","parameters":{"type":"object"}}},'
    '{"type":"function","function":{"name":"call_tool","parameters":{"type":"object"}}}]'
)
SYSTEM = "You are the agent of this thread."


def _ticks() -> Iterator[datetime]:
    start = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
    for n in count():
        yield start + timedelta(seconds=n)


def _assistant(content: str, calls: tuple[tuple[str, str, str], ...] = ()) -> str:
    message: dict[str, object] = {"role": "assistant", "content": content or None}
    if calls:
        message["tool_calls"] = [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
            for call_id, name, args in calls
        ]
    else:
        message["content"] = content
    return jsonbytes.dumps(message)


def _request(log: SessionLog, session: str, kind: RequestKind, perf: Perf) -> RequestRecord:
    messages = log.replay_messages(session)
    slot = log.get_session(session).slot
    epoch = log.current_epoch(session).number
    return RequestRecord(kind, slot, epoch, len(messages), messages_digest(messages), perf)


def write_session_log(path: Path) -> None:
    """Two sessions: ``alpha`` (two epochs, every entry kind, an interrupted tool call at the
    end) and ``beta`` (a pending turn)."""
    ticks = _ticks()
    with SessionLog.open(path, clock=lambda: next(ticks).isoformat(timespec="microseconds")) as log:
        log.ensure_session("alpha", 1)
        log.start_epoch("alpha", reason="new session", tools_text=TOOLS_1, system_text=SYSTEM)
        log.append_user("alpha", "Read notes.txt, s'il te plaît ✓", external_key="post-1")
        perf = Perf(cache_n=0, prompt_n=120, predicted_n=30, ttfb_ms=85.5, thinking_tokens=12)
        log.append_assistant(
            "alpha",
            _assistant("", (("call_a1", "read_file", '{"path": "notes.txt"}'),)),
            request=_request(log, "alpha", RequestKind.TURN, perf),
        )
        log.append_tool_result("alpha", tool_call_id="call_a1", content="line 1\nline 2")
        perf = Perf(cache_n=120, prompt_n=20, predicted_n=9, capped=True, extra={"note": "x"})
        log.append_assistant(
            "alpha",
            _assistant("It has two lines."),
            request=_request(log, "alpha", RequestKind.TOOL_FOLLOWUP, perf),
        )
        log.append_user("alpha", "And again?", external_key="post-2")
        failed = _request(log, "alpha", RequestKind.TURN, Perf(outcome="truncated"))
        log.append_broken("alpha", partial_text="It has", reason="stream ended", request=failed)
        log.append_note("alpha", "the stream broke; retried", refers_to=7)
        log.record_request("alpha", _request(log, "alpha", RequestKind.SELFTEST, Perf()))
        log.start_epoch(
            "alpha",
            reason="tool set changed",
            tools_text=TOOLS_2,
            system_text=SYSTEM,
            carry_over=True,
        )
        calls = (
            ("call_b1", "read_file", '{"path":"a.txt"}'),
            ("call_b2", "call_tool", '{"name": "gate", "arguments": {"x": 1}}'),
        )
        log.append_assistant(
            "alpha",
            _assistant("", calls),
            request=_request(log, "alpha", RequestKind.TURN, Perf(prompt_n=40)),
        )
        log.append_tool_result("alpha", tool_call_id="call_b1", content="a")
        log.ensure_session("beta", 0)
        log.start_epoch("beta", reason="new session", tools_text=TOOLS_1, system_text=SYSTEM)
        log.append_user("beta", "Hello?", external_key="local-beta-1")


def write_chat_state(path: Path) -> None:
    state = ChatState.open(path)
    try:
        state.advance("chan-1", 1_700_000_000_000, "post-a")
        state.advance("chan-1", 1_700_000_000_500, "post-b")
        state.advance("chan-2", 1_700_000_000_100, "post-c")
        state.save_connection("conn-1", 7)
        state.save_connection("conn-2", 3)
        state.mark_seen("post-a", "stored")
        state.mark_seen("post-b", "stopped")
        state.remember_thread("root-1", "chan-1")
        state.record_intent("root-1#4", 2)
        state.record_posted("root-1#4", 0, "reply-1")
        state.record_intent("root-1#9", 1)
    finally:
        state.close()


def write_chat_state_with_held(path: Path) -> None:
    """As ``write_chat_state``, and two messages held while a turn ran, one of them released."""
    write_chat_state(path)
    state = ChatState.open(path)
    try:
        state.hold("post-h1", "mm:root-1", "first, while the turn ran")
        state.hold("post-h2", "mm:root-1", "second, still held ✓")
        state.release("post-h1")
    finally:
        state.close()


def write_audit_log(path: Path) -> None:
    ticks = _ticks()
    audit = AuditLog.open(path, clock=lambda: next(ticks))
    try:
        audit.record_find("alpha", "open a gate", ["gate", "lamp"], "gate: opens a gate")
        audit.record_start(CallRequest("alpha", "call_b2", "gate", '{"x": 1}'))
        audit.record_end("alpha", "call_b2", "ok", "opened")
        audit.record_start(CallRequest("alpha", "call_c1", "lamp", "{}"))
    finally:
        audit.close()


def main(folder: Path, which: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    if which == "held":
        write_chat_state_with_held(folder / "chat-0.1.0-held.db")
        return
    write_session_log(folder / "loopd-0.1.0.db")
    write_chat_state(folder / "chat-0.1.0.db")
    write_audit_log(folder / "brokerd-audit-0.1.0.db")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "all")
