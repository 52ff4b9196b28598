"""``loopd perf``: the session log's perf records (``loopd.observe.perfsummary``), as JSON or as a
summary: of every session together first (the wait people saw, then the rest), then one line per
session; or of the one ``--session`` names.

``--since`` keeps the requests made since a moment (``2h``, ``30m``, ``7d``, or an ISO date or
time, UTC unless it says otherwise); ``--plot FILE.png`` draws them (``loopd.cli.perfplot``).
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TextIO

from loopd.cli.base import log_handler
from loopd.errors import EXIT_CANNOT
from loopd.observe.perfsummary import format_summary, perf_records, session_table, summarize
from loopd.sessionlog.errors import LogError, UnknownSessionError
from loopd.sessionlog.reading import existing_log
from loopd.sessionlog.records import Request
from loopd.sessionlog.store import SessionLog

_AGO = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw])")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def parse_since(text: str, now: datetime) -> datetime:
    """``2h``, ``30m``, ``7d`` before ``now``, or an ISO date or time (UTC unless it names its
    offset); ``ValueError`` saying what is accepted otherwise."""
    text = text.strip()
    if match := _AGO.fullmatch(text):
        amount, unit = float(match.group(1)), _UNITS[match.group(2)]
        return now - timedelta(**{unit: amount})
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"{text!r} is neither a span (30m, 2h, 7d) nor an ISO date or time (2026-05-01)"
        ) from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def made_since(requests: Iterable[Request], since: datetime | None) -> list[Request]:
    if since is None:
        return list(requests)
    return [r for r in requests if datetime.fromisoformat(r.created_at) >= since]


def run(args: argparse.Namespace, db_path: Path, out: TextIO, err: TextIO) -> int:
    """The ``perf`` command: 0 on success (no log yet is no sessions), 2 when the log cannot be
    read or has no such session, for a bad ``--since``, or for a plot that cannot be drawn."""
    try:
        since = parse_since(args.since, datetime.now(UTC)) if args.since else None
    except ValueError as exc:
        err.write(f"loopd: perf: --since: {exc}\n")
        return EXIT_CANNOT
    try:
        with existing_log(db_path) as log:
            by_session = _requests(log, db_path, args.session)
    except LogError as exc:
        err.write(f"loopd: perf: {exc}\n")
        return EXIT_CANNOT
    by_session = {name: made_since(rows, since) for name, rows in by_session.items()}
    if args.plot is not None:
        from loopd.cli.perfplot import PlotError, plot_requests

        try:
            drawn = plot_requests(by_session, args.plot)
        except PlotError as exc:
            err.write(f"loopd: perf: --plot: {exc}\n")
            return EXIT_CANNOT
        err.write(f"wrote {args.plot} ({drawn} requests)\n")
    if args.json:
        records = [r for name, rows in by_session.items() for r in perf_records(name, rows)]
        out.write(json.dumps(records, indent=2, ensure_ascii=False) + "\n")
        return 0
    if not by_session:
        out.write(f"no sessions in {db_path}\n")
    elif len(by_session) == 1:
        ((name, rows),) = by_session.items()
        out.write(format_summary(f"session {name}", summarize(rows)) + "\n")
    else:
        every = [r for rows in by_session.values() for r in rows]
        out.write(format_summary("all sessions", summarize(every)) + "\n\n")
        summaries = {name: summarize(rows) for name, rows in by_session.items()}
        out.write(session_table(summaries) + "\n")
    return 0


handler = log_handler(run)


def _requests(
    log: SessionLog | None, db_path: Path, session: str | None
) -> dict[str, list[Request]]:
    if log is None and session is not None:
        raise UnknownSessionError(db_path, f"no session {session!r}")
    if log is None:
        return {}
    names = [session] if session else [s.name for s in log.sessions()]
    return {name: log.requests(name) for name in names}
