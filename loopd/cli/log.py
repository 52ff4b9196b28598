"""CLI commands over the session log: ``sessions``,
``log show|export|verify|search|backup|restore``.

The ``run_*`` handlers are the ones ``loopd.cli.parser`` names, ``handler(args, settings)`` as
every loopd subcommand has. The functions below do the work; they can be called directly
with a database path and text streams, and return the exit status: 0 done, 2 the log cannot be
read or has no such session; ``verify_log`` 1 when the log is not sound. ``sessions`` and ``log
search`` print what ``loopd.logviews`` writes (the terminal's ``/sessions`` and ``/search`` too).

Reading never creates or changes a log (``loopd.sessionlog.reading``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Final, TextIO

from loopcommon import jsonbytes
from loopcommon.sanitize import for_terminal
from loopd.cli.base import log_handler
from loopd.errors import EXIT_CANNOT
from loopd.logviews import list_sessions, search_entries
from loopd.sessionlog.backup import backup_state, restore_state
from loopd.sessionlog.errors import LogError, UnknownSessionError
from loopd.sessionlog.reading import existing_log
from loopd.sessionlog.records import Entry
from loopd.sessionlog.search import DEFAULT_LIMIT
from loopd.sessionlog.verify import verify
from loopd.statedir import check_state_dir
from loopd.transcript import latest_session, markdown, openai_messages

if TYPE_CHECKING:
    from loopd.config import Settings

EXIT_BAD_LOG: Final = 1  # log verify: the log is not sound

EXPORT_FIELDS = (
    "seq",
    "epoch",
    "kind",
    "message",
    "text",
    "reason",
    "external_key",
    "tool_call_id",
    "request_row",
    "refers_to",
    "tools_sha256",
    "created_at",
    "prev_hash",
    "hash",
)
_PREVIEW_CHARS = 100


def _sessions(args: argparse.Namespace, db_path: Path, out: TextIO, err: TextIO) -> int:
    return list_sessions(db_path, out, err)


def _show(args: argparse.Namespace, db_path: Path, out: TextIO, err: TextIO) -> int:
    return show_log(db_path, args.session, out, err)


def _export(args: argparse.Namespace, db_path: Path, out: TextIO, err: TextIO) -> int:
    return export(db_path, args.session, args.format, out, err)


def _verify(args: argparse.Namespace, db_path: Path, out: TextIO, err: TextIO) -> int:
    return verify_log(db_path, args.session, out, err)


def _search(args: argparse.Namespace, db_path: Path, out: TextIO, err: TextIO) -> int:
    limit = args.limit or DEFAULT_LIMIT
    return search_entries(db_path, args.words, out, err, limit=limit, session=args.session)


def run_backup(args: argparse.Namespace, settings: Settings) -> int:
    check_state_dir(settings.state_dir, create=False)
    report = backup_state(settings.state_dir, args.dest)
    print(report.summary("backed up", args.dest))
    return 0


def run_restore(args: argparse.Namespace, settings: Settings) -> int:
    check_state_dir(settings.state_dir, create=True)
    report = restore_state(args.source, settings.state_dir)
    print(report.summary("restored", args.source))
    return 0


run_sessions = log_handler(_sessions)
run_show = log_handler(_show)
run_export = log_handler(_export)
run_verify = log_handler(_verify)
run_search = log_handler(_search)


def _no_session(db_path: Path, session: str) -> UnknownSessionError:
    return UnknownSessionError(db_path, f"no session {session!r}")


def show_log(db_path: Path, session: str, out: TextIO, err: TextIO = sys.stderr) -> int:
    try:
        with existing_log(db_path) as log:
            if log is None:
                raise _no_session(db_path, session)
            target = log.get_session(session)
            out.write(f"session {target.name!r}, slot {target.slot}\n")
            for entry in log.entries(session):
                out.write(_entry_line(entry) + "\n")
    except LogError as exc:
        err.write(f"loopd: {exc}\n")
        return EXIT_CANNOT
    return 0


def _entry_line(entry: Entry) -> str:
    fields = entry.fields
    details = [
        f"{name}={value}"
        for name, value in (
            ("key", fields.external_key),
            ("call", fields.tool_call_id),
            ("request_row", fields.request_id),
            ("refers_to", fields.refers_to),
            ("reason", fields.reason),
        )
        if value is not None
    ]
    body = fields.message if fields.message is not None else (fields.text or "")
    preview = body.replace("\n", "\\n")
    if len(preview) > _PREVIEW_CHARS:
        preview = preview[:_PREVIEW_CHARS] + "..."
    head = f"{entry.seq:>6}  e{fields.epoch_number:<3} {entry.kind.value:<9}"
    return " ".join([head, *details, preview])


def export_log(db_path: Path, session: str, out: TextIO, err: TextIO = sys.stderr) -> int:
    """One JSON object a line, fields ``EXPORT_FIELDS``; ``message`` is the stored text."""
    try:
        with existing_log(db_path) as log:
            if log is None:
                raise _no_session(db_path, session)
            for entry in log.entries(session):
                out.write(jsonbytes.dumps(export_record(entry)) + "\n")
    except LogError as exc:
        err.write(f"loopd: {exc}\n")
        return EXIT_CANNOT
    return 0


def export_record(entry: Entry) -> dict[str, object]:
    fields = entry.fields
    values: tuple[object, ...] = (
        fields.seq,
        fields.epoch_number,
        fields.kind.value,
        fields.message,
        fields.text,
        fields.reason,
        fields.external_key,
        fields.tool_call_id,
        fields.request_id,
        fields.refers_to,
        fields.tools_sha256,
        fields.created_at,
        entry.prev_hash,
        entry.hash,
    )
    return dict(zip(EXPORT_FIELDS, values, strict=True))


def verify_log(db_path: Path, session: str | None, out: TextIO, err: TextIO = sys.stderr) -> int:
    """Exit 0 when the chain and replay identity hold; 1 with the first offending row named (or
    the file, when it is not a sound session log); 2 for a session the log does not have."""
    try:
        with existing_log(db_path) as log:
            if log is None and session is not None:
                raise _no_session(db_path, session)
            if log is None:
                out.write(f"ok: {db_path}: no session log yet, nothing to verify\n")
                return 0
            problems = verify(log, session)
            checked = [session] if session is not None else [s.name for s in log.sessions()]
    except UnknownSessionError as exc:
        err.write(f"loopd: log verify: {exc}\n")
        return EXIT_CANNOT
    except LogError as exc:
        err.write(f"loopd: log verify: {exc}\n")
        return EXIT_BAD_LOG
    if problems:
        err.write(f"loopd: log verify: {db_path}: first problem: {problems[0]}\n")
        for problem in problems[1:]:
            err.write(f"  also: {problem}\n")
        return EXIT_BAD_LOG
    out.write(f"ok: {db_path}: {len(checked)} session(s), hash chain and replay identity hold\n")
    return 0


JsonLines = Callable[[Path, str, TextIO, TextIO], int]


def export(db_path: Path, session: str | None, fmt: str, out: TextIO, err: TextIO) -> int:
    """Write ``session`` (default: the one written to last) in ``fmt``; ``jsonl`` is the entries as
    JSON lines (``export_log``). 0, or 2 with one line when the log cannot give
    it. The ``openai`` array is written as it is, byte for byte, with a newline only on a
    terminal; the ``markdown`` transcript on a terminal passes ``for_terminal``."""
    try:
        with existing_log(db_path) as log:
            name = session
            if log is not None and name is None:
                name = latest_session(log)
            if log is None or name is None:
                raise UnknownSessionError(
                    db_path, f"no session {session!r}" if session else "no sessions yet"
                )
            if fmt == "openai":
                out.write(openai_messages(log, name) + ("\n" if out.isatty() else ""))
            elif fmt == "markdown":
                text = markdown(name, log.epochs(name), log.entries(name))
                # Read on a terminal, the transcript is shown as text; to a file it is as written.
                out.write(for_terminal(text) if out.isatty() else text)
    except LogError as exc:
        err.write(f"loopd: {exc}\n")
        return 2
    return export_log(db_path, name, out, err) if fmt == "jsonl" else 0
