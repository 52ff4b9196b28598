"""Pure derivation of what a session is waiting for, from its entries.

Nothing about a turn's progress is stored as state: after a crash the rows alone say whether a
turn is pending and which tool calls were interrupted (made by the latest assistant message, with
no result entry).

A turn is pending while the last replayed entry is a user message or a tool result, until it ends.
It ends with an answer (an assistant message without tool calls), or without one, for good: a
person's stop (a broken entry, ``loopd.turnstop``) or a ``TURN_ENDED`` note (a request failed, a
time limit, the repeat guard, the round limit). A turn ended so never runs again: only a turn cut
by a crash or a restart, which wrote no end, is resumed. A ``TAKEN_BACK`` note undoes the entry it
refers to: an answer leaves the replay and its turn is pending again (a regenerate), a turn's end
no longer ends it (the turn is run again).
"""

from collections.abc import Iterable, Sequence

from loopd.sessionlog.assistant import tool_calls_of
from loopd.sessionlog.records import (
    REPLAYED_KINDS,
    STOPPED_BY,
    Entry,
    EntryKind,
    InterruptedCall,
    NoteReason,
    SessionState,
)


def derive_state(session: str, entries: Sequence[Entry]) -> SessionState:
    """State from a session's entries in log order.

    ``entries`` may be only the tail of the current epoch, as long as it starts at or before its
    latest assistant entry.
    """
    taken = taken_back(entries)
    pending, ended_by, last = False, None, None
    for entry in entries:
        if entry.seq in taken:
            continue
        if entry.kind in REPLAYED_KINDS:
            pending, ended_by, last = entry.kind in (EntryKind.USER, EntryKind.TOOL), None, entry
        elif ends_turn(entry) and pending:
            pending, ended_by = False, entry
        elif is_take_back(entry):
            pending, ended_by = True, None
    replayed = [e for e in entries if e.kind in REPLAYED_KINDS and e.seq not in taken]
    last_seq = last.seq if last is not None else 0
    broken = tuple(e for e in entries if e.kind is EntryKind.BROKEN and e.seq > last_seq)
    return SessionState(
        session=session,
        pending_turn=pending,
        interrupted_calls=unanswered_calls(replayed),
        broken_since=broken,
        ended_by=ended_by,
        answer=last if last is not None and is_answer(last) else None,
    )


def is_stop(entry: Entry) -> bool:
    """A broken entry that records a person's stop."""
    return entry.kind is EntryKind.BROKEN and (entry.fields.reason or "").startswith(STOPPED_BY)


def is_turn_ended(entry: Entry) -> bool:
    """A note that ends its turn without an answer, for good."""
    return entry.kind is EntryKind.NOTE and entry.fields.reason == NoteReason.TURN_ENDED


def ends_turn(entry: Entry) -> bool:
    """A record that ends the turn under way without an answer: a stop or a turn-ended note."""
    return is_stop(entry) or is_turn_ended(entry)


def is_take_back(entry: Entry) -> bool:
    return (
        entry.kind is EntryKind.NOTE
        and entry.fields.reason == NoteReason.TAKEN_BACK
        and entry.fields.refers_to is not None
    )


def taken_back(entries: Iterable[Entry]) -> frozenset[int]:
    """The seqs of the entries that the take-back notes among ``entries`` undo."""
    return frozenset(e.fields.refers_to for e in entries if is_take_back(e) and e.fields.refers_to)


def is_answer(entry: Entry) -> bool:
    """An assistant entry that answers: its message calls no tool."""
    if entry.kind is not EntryKind.ASSISTANT or entry.message is None:
        return False
    return not tool_calls_of(entry.message)


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
