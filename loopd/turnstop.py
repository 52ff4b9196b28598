"""How a turn that did not answer ends in the session log, for good, and how it is run again.

A turn stopped by a person: both front ends write the same record: a thread's ``stop`` in
Mattermost (``loopd.chat.threads``) and Ctrl-C during a turn in ``loopd chat`` (``loopd.terminal``).
The turn's stream is closed first (cancelling the request frees the slot on the server); then
every tool call the turn cut short gets a result saying so, and a broken entry records the stop
with the reason ``stopped by @<who>``. A thread's stop is also written to the chat state before
the turn is cancelled (``ChatState.ask_stop``), so loopd killed in between records the stop when
it starts again instead of running the turn.

A turn that ended without an answer in any other way (a request failed, a time limit, the repeat
guard, the round limit) gets a ``turn ended`` note with the line the person was shown
(``record_end``, written by ``loopd.sessions.Runtime.run_turn`` for every front end).

Either way the turn is over: a restart does not run it again (``loopd.sessionlog.state``). Only a
person runs it again: ``/retry`` in the terminal, a 🔁 reaction in a thread (``take_back``), which
also generates an answer again.
"""

from __future__ import annotations

from typing import Final

from loopd.errors import LoopdError
from loopd.sessionlog.records import STOPPED_BY, Entry, NoteReason, SessionState
from loopd.sessionlog.state import is_stop
from loopd.sessionlog.store import SessionLog

STOPPED: Final = STOPPED_BY

__all__ = [
    "STOPPED",
    "NothingToRetry",
    "is_stop",
    "record_end",
    "record_stop",
    "retry_target",
    "take_back",
    "was_stopped",
]


def was_stopped(state: SessionState) -> bool:
    """The latest turn was stopped by a person (so a restart must not run it again)."""
    return state.ended_by is not None and is_stop(state.ended_by)


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


def record_end(session_log: SessionLog, session: str, line: str) -> Entry | None:
    """The turn under way ended without an answer: ``line``, as the person was shown it, in a
    note that keeps it from running again. None when no turn was pending (nothing to end)."""
    if not session_log.state(session).pending_turn:
        return None
    return session_log.append_note(session, line, reason=NoteReason.TURN_ENDED)


class NothingToRetry(LoopdError):
    """``take_back`` found no answer and no ended turn to run again; the message says why."""


def take_back(session_log: SessionLog, session: str, who: str) -> Entry:
    """Make the session's latest turn run again: its answer taken out of the replay (it is
    generated again from the same messages, which the server holds), or its end (a stop, a
    failure) undone. The earlier answer or end stays in the log. ``NothingToRetry`` when the
    session has neither: it is new, or a turn is under way."""
    target = retry_target(session_log.state(session))
    return session_log.append_note(
        session, f"run again by @{who}", reason=NoteReason.TAKEN_BACK, refers_to=target
    )


def retry_target(state: SessionState) -> int:
    """The entry a retry takes back: the end of a turn that did not answer, else the latest
    answer; ``NothingToRetry`` when there is neither."""
    if state.pending_turn or state.interrupted_calls:
        raise NothingToRetry("a turn is already under way or waiting to run")
    if state.ended_by is not None:
        return state.ended_by.seq
    if state.answer is not None:
        return state.answer.seq
    raise NothingToRetry("there is no answer to generate again yet")
