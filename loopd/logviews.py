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
from loopd.sessionlog.search import DEFAULT_LIMIT, SearchIndexError, search_log
from loopd.sessionlog.searchtext import EmptyQueryError
from loopd.turnstop import was_stopped

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
                return 0
            states = {state.session: state for state in log.pending_states()}
            for session in log.sessions():
                epochs = log.epochs(session.name)
                entries = log.entries(session.name)
                epoch = epochs[-1].number if epochs else 0
                state = states[session.name]
                if state.interrupted_calls:
                    ids = ", ".join(call.call_id for call in state.interrupted_calls)
                    label = f"interrupted tool calls: {ids}"
                else:
                    label = (
                        ("stopped" if was_stopped(state) else "pending turn")
                        if state.pending_turn
                        else "idle"
                    )
                slot = session.slot
                if placed:
                    endpoint = placed[session.name][0] if session.name in placed else "-"
                    slot = slots.get((session.name, endpoint), slot)
                    where = f"{endpoint:<12} "
                out.write(
                    f"{session.name:<32} {where}{slot:>4} {epoch:>5} {len(entries):>7}  {label}\n"
                )
    except LogError as exc:
        err.write(f"loopd: {exc}\n")
        return EXIT_CANNOT
    return 0
