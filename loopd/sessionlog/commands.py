"""CLI commands over the session log: ``sessions``, ``log show|export|verify``.

``register(subparsers)`` adds the parsers; each sets ``run`` to a function called as
``args.run(args, db_path, out, err) -> exit status``. The functions below can be called directly
with a database path and text streams.
"""

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from loopd import jsonbytes
from loopd.sessionlog.errors import LogError
from loopd.sessionlog.records import Entry
from loopd.sessionlog.store import SessionLog
from loopd.sessionlog.verify import verify

Runner = Callable[[argparse.Namespace, Path, TextIO, TextIO], int]

EXPORT_FIELDS = (
    "seq",
    "epoch",
    "kind",
    "message",
    "text",
    "reason",
    "external_key",
    "tool_call_id",
    "request_id",
    "refers_to",
    "tools_sha256",
    "created_at",
    "prev_hash",
    "hash",
)
_PREVIEW_CHARS = 100


def register(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    sessions = subparsers.add_parser("sessions", help="list sessions and what each waits for")
    sessions.set_defaults(run=_run_sessions)
    log = subparsers.add_parser("log", help="read and check the session log")
    log_commands = log.add_subparsers(dest="log_command", required=True)
    show = log_commands.add_parser("show", help="print a session's entries")
    show.add_argument("session")
    show.set_defaults(run=_run_show)
    export = log_commands.add_parser("export", help="a session's entries as JSON lines")
    export.add_argument("session")
    export.set_defaults(run=_run_export)
    check = log_commands.add_parser("verify", help="check the hash chain and replay identity")
    check.add_argument("session", nargs="?")
    check.set_defaults(run=_run_verify)


def _run_sessions(args: argparse.Namespace, db_path: Path, out: TextIO, err: TextIO) -> int:
    return list_sessions(db_path, out, err)


def _run_show(args: argparse.Namespace, db_path: Path, out: TextIO, err: TextIO) -> int:
    return show_log(db_path, args.session, out, err)


def _run_export(args: argparse.Namespace, db_path: Path, out: TextIO, err: TextIO) -> int:
    return export_log(db_path, args.session, out, err)


def _run_verify(args: argparse.Namespace, db_path: Path, out: TextIO, err: TextIO) -> int:
    return verify_log(db_path, args.session, out, err)


def list_sessions(db_path: Path, out: TextIO, err: TextIO = sys.stderr) -> int:
    try:
        with SessionLog.open(db_path, create=False) as log:
            states = {state.session: state for state in log.pending_states()}
            out.write(f"{'SESSION':<32} {'SLOT':>4} {'EPOCH':>5} {'ENTRIES':>7}  STATE\n")
            for session in log.sessions():
                epochs = log.epochs(session.name)
                entries = log.entries(session.name)
                epoch = epochs[-1].number if epochs else 0
                state = states[session.name]
                if state.interrupted_calls:
                    ids = ", ".join(call.call_id for call in state.interrupted_calls)
                    label = f"interrupted tool calls: {ids}"
                else:
                    label = "pending turn" if state.pending_turn else "idle"
                out.write(
                    f"{session.name:<32} {session.slot:>4} {epoch:>5} {len(entries):>7}  {label}\n"
                )
    except LogError as exc:
        err.write(f"loopd: {exc}\n")
        return 1
    return 0


def show_log(db_path: Path, session: str, out: TextIO, err: TextIO = sys.stderr) -> int:
    try:
        with SessionLog.open(db_path, create=False) as log:
            target = log.get_session(session)
            out.write(f"session {target.name!r}, slot {target.slot}\n")
            for entry in log.entries(session):
                out.write(_entry_line(entry) + "\n")
    except LogError as exc:
        err.write(f"loopd: {exc}\n")
        return 1
    return 0


def _entry_line(entry: Entry) -> str:
    fields = entry.fields
    details = [
        f"{name}={value}"
        for name, value in (
            ("key", fields.external_key),
            ("call", fields.tool_call_id),
            ("request", fields.request_id),
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
        with SessionLog.open(db_path, create=False) as log:
            for entry in log.entries(session):
                out.write(jsonbytes.dumps(export_record(entry)) + "\n")
    except LogError as exc:
        err.write(f"loopd: {exc}\n")
        return 1
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
    """Exit 0 when the chain and replay identity hold; 1 with the first offending row named."""
    try:
        with SessionLog.open(db_path, create=False) as log:
            problems = verify(log, session)
            checked = [session] if session is not None else [s.name for s in log.sessions()]
    except LogError as exc:
        err.write(f"loopd: log verify: {exc}\n")
        return 1
    if problems:
        err.write(f"loopd: log verify: {db_path}: first problem: {problems[0]}\n")
        for problem in problems[1:]:
            err.write(f"  also: {problem}\n")
        return 1
    out.write(f"ok: {db_path}: {len(checked)} session(s), hash chain and replay identity hold\n")
    return 0
