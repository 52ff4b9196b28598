"""``loopd log export --format markdown|openai``: a session as a readable transcript, or as the
OpenAI ``messages`` array loopd replays. The renderings are pure (entries in, text out).

``openai`` is the current epoch's messages exactly as loopd sends them, byte for byte: the stored
serializations joined by the session log's own ``messages_array``, the same bytes every request
of the epoch begins its ``messages`` with (its last request's, plus what came after it). Feed it
to any OpenAI-compatible server to replay the conversation.

``markdown`` is for people: every epoch with its reason, the system text, each message with its
author, thinking folded into a ``<details>`` block, tool calls with their arguments and results,
and what is never replayed (broken requests, stops, notes) as one italic line each. The messages
an epoch carried over from the one before are not repeated.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Final

from loopd.sessionlog.assistant import tool_calls_of
from loopd.sessionlog.records import Entry, EntryKind, Epoch
from loopd.sessionlog.replay import messages_array
from loopd.sessionlog.store import SessionLog
from loopd.wire.assemble import ToolCall

FORMATS: Final = ("jsonl", "markdown", "openai")
_FENCE = "```"


def openai_messages(log: SessionLog, session: str) -> str:
    """The current epoch's messages array, as replayed."""
    return messages_array(log.replay_messages(session))


def latest_session(log: SessionLog) -> str | None:
    """The session written to last (the highest entry id), or None in an empty log."""
    latest: tuple[int, str] | None = None
    for session in log.sessions():
        entries = log.entries(session.name)
        if entries and (latest is None or entries[-1].id > latest[0]):
            latest = (entries[-1].id, session.name)
    return None if latest is None else latest[1]


def markdown(session: str, epochs: Sequence[Epoch], entries: Sequence[Entry]) -> str:
    lines = [f"# Session `{session}`", ""]
    by_number = {epoch.number: epoch for epoch in epochs}
    carried = 0
    for entry in entries:
        if entry.fields.refers_to is not None and entry.kind in _MESSAGE_KINDS:
            carried += 1
            continue
        if carried:
            lines += [f"_({carried} messages carried over from the epoch before)_", ""]
            carried = 0
        lines += _entry_markdown(entry, by_number.get(entry.fields.epoch_number))
    if carried:
        lines += [f"_({carried} messages carried over from the epoch before)_", ""]
    return "\n".join(lines).rstrip() + "\n"


_MESSAGE_KINDS = frozenset({EntryKind.USER, EntryKind.ASSISTANT, EntryKind.TOOL})


def _entry_markdown(entry: Entry, epoch: Epoch | None) -> list[str]:
    fields = entry.fields
    message = _message(entry)
    match entry.kind:
        case EntryKind.EPOCH:
            reason = fields.reason or (epoch.reason if epoch else "")
            head = f"## Epoch {fields.epoch_number}" + (f" ({reason})" if reason else "")
            return [head, "", f"**System:** {message.get('content', '')}", ""]
        case EntryKind.USER:
            return [f"**User** ({fields.created_at}):", "", _quote(message.get("content")), ""]
        case EntryKind.ASSISTANT:
            return _assistant_markdown(message, tool_calls_of(entry.message or ""))
        case EntryKind.TOOL:
            return [
                f"**Tool result** (`{fields.tool_call_id}`):",
                "",
                _fenced(str(message.get("content", ""))),
                "",
            ]
        case EntryKind.BROKEN:
            return [f"_(not replayed: {fields.reason or 'broken request'})_", ""]
        case EntryKind.NOTE:
            return [f"_(note: {fields.text or ''})_", ""]
    return []  # pragma: no cover - every kind is matched


def _assistant_markdown(message: dict[str, Any], calls: Sequence[ToolCall]) -> list[str]:
    lines = ["**Assistant:**", ""]
    reasoning = message.get("reasoning_content")
    if reasoning:
        lines += ["<details><summary>thinking</summary>", "", _quote(reasoning), "", "</details>"]
        lines.append("")
    content = message.get("content")
    if content:
        lines += [str(content), ""]
    for call in calls:
        lines += [
            f"Tool call `{call.name}` (`{call.id}`):",
            "",
            _fenced(call.arguments, "json"),
            "",
        ]
    return lines


def _message(entry: Entry) -> dict[str, Any]:
    if entry.message is None:
        return {}
    parsed = json.loads(entry.message)
    return parsed if isinstance(parsed, dict) else {}


def _quote(text: object) -> str:
    return "\n".join(f"> {line}" if line else ">" for line in str(text or "").splitlines())


def _fenced(text: str, language: str = "text") -> str:
    fence = _FENCE
    while fence in text:  # a fence longer than any run of backticks inside
        fence += "`"
    return f"{fence}{language}\n{text}\n{fence}"
