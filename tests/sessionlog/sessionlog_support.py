"""Helpers shared by the session-log tests."""

from collections.abc import Sequence
from pathlib import Path

from loopcommon import jsonbytes
from loopd.sessionlog import RequestKind, RequestRecord, SessionLog, messages_digest

TOOLS = '[{"type":"function","function":{"name":"read_file","parameters":{"type":"object"}}}]'
SYSTEM = "You are the agent of this thread."


def assistant_text(
    content: str = "", *, reasoning: str | None = None, calls: Sequence[tuple[str, str, str]] = ()
) -> str:
    """An assistant message as the stream assembler builds it; calls are (id, name, arguments)."""
    message: dict[str, object] = {"role": "assistant", "content": content}
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
            for call_id, name, args in calls
        ]
    return jsonbytes.dumps(message)


def request_for(
    log: SessionLog, session: str, kind: RequestKind = RequestKind.TURN
) -> RequestRecord:
    """The record of a request that sent the session's current replay."""
    messages = log.replay_messages(session)
    epoch = log.current_epoch(session)
    slot = log.get_session(session).slot
    return RequestRecord(kind, slot, epoch.number, len(messages), messages_digest(messages))


def open_started(path: Path, session: str = "thread-1", slot: int = 0) -> SessionLog:
    """A log with one session and its first epoch."""
    log = SessionLog.open(path)
    log.ensure_session(session, slot)
    log.start_epoch(session, reason="start", tools_text=TOOLS, system_text=SYSTEM)
    return log
