"""The session log as ``loopd sessions`` and ``loopd log search`` print it, and the terminal's
``/sessions`` and ``/search`` show it: one line a session, one line a hit. Each function takes the
log's path and text streams and returns the exit status: 0 done, ``EXIT_CANNOT`` the log cannot be
read; ``search_entries`` ``EXIT_NOT_FOUND`` when no entry mentions the words (as grep). Reading
never creates or changes a log (``loopd.sessionlog.reading``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Final, TextIO

from loopcommon.sanitize import for_terminal
from loopd.errors import EXIT_CANNOT
from loopd.sessionlog.errors import LogError
from loopd.sessionlog.reading import existing_log
from loopd.sessionlog.records import SessionState
from loopd.sessionlog.search import DEFAULT_LIMIT, SearchIndexError, search_log
from loopd.sessionlog.searchtext import EmptyQueryError
from loopd.turnstop import is_stop

EXIT_NOT_FOUND: Final = 1  # log search: no entry mentions the words


def search_entries(
    db_path: Path,
    words: list[str],
    out: TextIO,
    err: TextIO = sys.stderr,
    *,
    limit: int = DEFAULT_LIMIT,
    session: str | None = None,
) -> int:
    """One line a hit, newest first: when, the session, the entry's seq and kind, and a line of
    context around the words (``loopd.sessionlog.searchtext``). On a terminal each line passes
    ``for_terminal`` (it quotes what the model or a person wrote); to a file or a pipe it is data.
    The index beside the log is brought up to date first; the log itself is only read."""
    try:
        hits = search_log(db_path, words, limit=limit, session=session)
    except (EmptyQueryError, LogError, SearchIndexError) as exc:
        err.write(f"loopd: log search: {exc}\n")
        return EXIT_CANNOT
    if not hits:
        where = f" of session {session!r}" if session else ""
        asked = for_terminal(" ".join(words))
        err.write(f"loopd: log search: no entry{where} mentions {asked!r}\n")
        return EXIT_NOT_FOUND
    shown = for_terminal if out.isatty() else str
    for hit in hits:
        out.write(shown(hit.line()) + "\n")
    return 0


def list_sessions(db_path: Path, out: TextIO, err: TextIO = sys.stderr) -> int:
    try:
        with existing_log(db_path) as log:
            # Where loopd runs several servers, each session's endpoint (that of its latest
            # request) and its slot there; the one-server log keeps its columns.
            placed = log.last_endpoints() if log is not None else {}
            slots = log.endpoint_slots() if log is not None else {}
            where = f"{'ENDPOINT':<12} " if placed else ""
            out.write(f"{'SESSION':<32} {where}{'SLOT':>4} {'EPOCH':>5} {'ENTRIES':>7}  STATE\n")
            if log is None:
                # A mistyped LOOPD_STATE_DIR looks like a fresh install: say which folder.
                err.write(f"loopd: {_no_log_yet(db_path)}\n")
                return 0
            # Names and lines quote what threads were called and what servers answered.
            shown = for_terminal if out.isatty() else str
            states = {state.session: state for state in log.pending_states()}
            for session in log.sessions():
                epochs = log.epochs(session.name)
                entries = log.entries(session.name)
                epoch = epochs[-1].number if epochs else 0
                label = state_label(states[session.name])
                slot = session.slot
                if placed:
                    endpoint = placed[session.name][0] if session.name in placed else "-"
                    slot = slots.get((session.name, endpoint), slot)
                    where = f"{endpoint:<12} "
                row = f"{session.name:<32} {where}{slot:>4} {epoch:>5} {len(entries):>7}  {label}"
                out.write(shown(row) + "\n")
    except LogError as exc:
        err.write(f"loopd: {exc}\n")
        return EXIT_CANNOT
    return 0


_LABEL_CHARS = 72


def _no_log_yet(db_path: Path) -> str:
    folder = db_path.parent
    if not folder.is_dir():
        return f"no sessions: the state folder {folder} does not exist (LOOPD_STATE_DIR)"
    return f"no sessions yet: no session log in {folder} (LOOPD_STATE_DIR)"


def state_label(state: SessionState) -> str:
    """What the session's latest turn was, in a few words: answered, stopped by someone, ended
    without an answer (the line shown then, cut), or cut by a crash or a restart (it runs at the
    next start: ``pending turn``, ``interrupted tool calls``)."""
    if state.interrupted_calls:
        ids = ", ".join(call.call_id for call in state.interrupted_calls)
        return f"interrupted tool calls: {ids}"
    if state.pending_turn:
        return "pending turn"
    if state.ended_by is not None and is_stop(state.ended_by):
        return (state.ended_by.fields.reason or "stopped").replace("\n", " ")
    if state.ended_by is not None:
        line = " ".join((state.ended_by.fields.text or "").split())
        label = f"ended: {line}"
        return label if len(label) <= _LABEL_CHARS else label[: _LABEL_CHARS - 3] + "..."
    return "answered" if state.answer is not None else "idle"
