"""``loopd usage``: prompt and generated tokens and GPU seconds per person, channel and day
(``loopd.usage``), as a table or as JSON.

``--since`` keeps the requests made since a moment, as ``loopd perf`` reads it (``2h``, ``7d``, an
ISO date); ``--person`` keeps one person's rows.
"""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

from loopcommon.sanitize import for_terminal
from loopd.chat.cursor import ChatStateError
from loopd.cli.base import log_handler
from loopd.cli.perf import made_since, parse_since
from loopd.errors import EXIT_CANNOT
from loopd.sessionlog.errors import LogError
from loopd.sessionlog.reading import existing_log
from loopd.sessionlog.records import Request
from loopd.terminal.link import local_user
from loopd.usage.ledger import Ledger, format_ledger, ledger_records
from loopd.usage.source import log_ledger, thread_labels


def run(args: argparse.Namespace, db_path: Path, out: TextIO, err: TextIO) -> int:
    """The ``usage`` command: 0 on success (no log yet is no usage), 2 when the log or the chat
    state cannot be read, or for a bad ``--since``."""
    try:
        since = parse_since(args.since, datetime.now(UTC)) if args.since else None
    except ValueError as exc:
        err.write(f"loopd: usage: --since: {exc}\n")
        return EXIT_CANNOT

    def keep(requests: list[Request]) -> list[Request]:
        return made_since(requests, since)

    try:
        labels = thread_labels(db_path.parent)
        with existing_log(db_path) as log:
            ledger: Ledger = {} if log is None else log_ledger(log, labels, local_user(), keep)
    except (LogError, ChatStateError) as exc:
        err.write(f"loopd: usage: {exc}\n")
        return EXIT_CANNOT
    if args.person is not None:
        ledger = {key: usage for key, usage in ledger.items() if key.person == args.person}
    if args.json:
        out.write(json.dumps(ledger_records(ledger), indent=2, ensure_ascii=False) + "\n")
    else:
        table = format_ledger(ledger)
        # Names come from Mattermost and the thread labels: shown, never obeyed by a terminal.
        out.write((for_terminal(table) if out.isatty() else table) + "\n")
    return 0


handler = log_handler(run)
