"""A turn stopped by a person: its record in the session log, and how a restart recognises it.

Both front ends write the same record: a thread's ``stop`` in Mattermost (``loopd.chat.threads``)
and Ctrl-C during a turn in ``loopd chat`` (``loopd.terminal``). The turn's stream is closed
first (cancelling the request frees the slot on the server); then every tool call the turn cut
short gets a result saying so, and a broken entry records the stop with the reason
``stopped by @<who>``. A turn left pending that way is not run again when loopd starts. A thread's
stop is also written to the chat state before the turn is cancelled (``ChatState.ask_stop``), so
loopd killed in between records the stop when it starts again instead of running the turn.
"""

from __future__ import annotations

from typing import Final

from loopd.sessionlog.records import Entry, EntryKind, SessionState
from loopd.sessionlog.store import SessionLog

STOPPED: Final = "stopped by "


def is_stop(entry: Entry) -> bool:
    """A broken entry that records a person's stop."""
    return entry.kind is EntryKind.BROKEN and (entry.fields.reason or "").startswith(STOPPED)


def was_stopped(state: SessionState) -> bool:
    """The pending turn was stopped by a person (so a restart must not run it again)."""
    return any(is_stop(entry) for entry in state.broken_since)


def record_stop(session_log: SessionLog, session: str, who: str) -> Entry:
    """A stopped turn, in the log: results for the tool calls it cut short, then the stop."""
    for call in session_log.state(session).interrupted_calls:
        session_log.append_tool_result(
            session,
            tool_call_id=call.call_id,
            content=f"error: stopped by @{who} while this tool call ran; it may or may not "
            "have taken effect",
        )
    return session_log.append_broken(session, partial_text="", reason=f"{STOPPED}@{who}")
