"""Pure derivation of what a session is waiting for, from its entries.

Nothing about a turn's progress is stored as state: after a crash the rows alone say whether a
turn is pending (the last replayed entry is a user message or a tool result) and which tool calls
were interrupted (made by the latest assistant message, with no result entry).
"""

from collections.abc import Sequence

from loopd.sessionlog.assistant import tool_calls_of
from loopd.sessionlog.records import (
    REPLAYED_KINDS,
    Entry,
    EntryKind,
    InterruptedCall,
    SessionState,
)


def derive_state(session: str, entries: Sequence[Entry]) -> SessionState:
    """State from a session's entries in log order.

    ``entries`` may be only the tail of the current epoch, as long as it starts at or before its
    latest assistant entry.
    """
    replayed = [entry for entry in entries if entry.kind in REPLAYED_KINDS]
    last = replayed[-1] if replayed else None
    pending = last is not None and last.kind in (EntryKind.USER, EntryKind.TOOL)
    last_seq = last.seq if last is not None else 0
    broken = tuple(e for e in entries if e.kind is EntryKind.BROKEN and e.seq > last_seq)
    return SessionState(
        session=session,
        pending_turn=pending,
        interrupted_calls=unanswered_calls(replayed),
        broken_since=broken,
    )


def unanswered_calls(entries: Sequence[Entry]) -> tuple[InterruptedCall, ...]:
    """Tool calls of the latest assistant entry that have no tool-result entry after it."""
    latest = next((e for e in reversed(entries) if e.kind is EntryKind.ASSISTANT), None)
    if latest is None or latest.message is None:
        return ()
    answered = {
        e.fields.tool_call_id for e in entries if e.kind is EntryKind.TOOL and e.seq > latest.seq
    }
    return tuple(
        InterruptedCall(call, assistant_seq=latest.seq)
        for call in tool_calls_of(latest.message)
        if call.id not in answered
    )
