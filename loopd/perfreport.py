"""``loopd perf``: the per-request perf records of the session log, as JSON or as a summary.

The core is pure: ``perf_records`` and ``summarize`` read ``Request`` rows (as the session log
returns them) and ``format_summary`` writes text. The JSON keeps the server's own field names
(``cache_n``, ``prompt_n``, ``predicted_n``) so a record can be set beside the server's timings.

Two figures need a definition:

- *hit rate*: prompt tokens the server reused over all prompt tokens it was sent,
  ``sum(cache_n) / sum(cache_n + prompt_n)``.
- *recompute per turn*: prompt tokens the server evaluated (``prompt_n``, retries and tool
  follow-ups included) over the number of turns. A turn is one set of messages sent as a
  ``turn`` request: its retries send the same bytes, so they count once.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from loopd.sessionlog.commands import EXIT_CANNOT, existing_log, log_handler
from loopd.sessionlog.errors import LogError, UnknownSessionError
from loopd.sessionlog.records import Request, RequestKind
from loopd.sessionlog.store import SessionLog

# Recorded in a request's ``extra`` by the turn engine; copied into the JSON when present.
_EXTRA_FIELDS = ("expected_reuse", "failure", "detail", "status_code", "finish_reason")


def perf_record(session: str, request: Request) -> dict[str, Any]:
    """One request as a flat JSON object, the server's counters under their own names."""
    record, perf = request.record, request.record.perf
    out: dict[str, Any] = {
        "session": session,
        "request_id": request.id,
        "created_at": request.created_at,
        "kind": record.kind.value,
        "slot": record.slot,
        "epoch": record.epoch,
        "outcome": perf.outcome,
        "cache_n": perf.cache_n,
        "prompt_n": perf.prompt_n,
        "predicted_n": perf.predicted_n,
        "ttfb_ms": perf.ttfb_ms,
        "queue_wait_ms": perf.queue_wait_ms,
        "prompt_per_second": perf.prompt_per_second,
        "predicted_per_second": perf.predicted_per_second,
        "thinking_tokens": perf.thinking_tokens,
        "capped": perf.capped,
        "cache_loss": perf.cache_loss,
        "cache_loss_cause": perf.cache_loss_cause,
        "message_count": record.message_count,
    }
    out.update({name: perf.extra[name] for name in _EXTRA_FIELDS if name in perf.extra})
    return out


def perf_records(session: str, requests: Iterable[Request]) -> list[dict[str, Any]]:
    return [perf_record(session, request) for request in requests]


@dataclass
class LossTally:
    requests: int = 0
    tokens: int = 0


@dataclass
class PerfSummary:
    requests: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)
    cache_n: int = 0
    prompt_n: int = 0
    turns: int = 0
    capped: int = 0
    broken: int = 0
    losses: dict[str, LossTally] = field(default_factory=dict)

    @property
    def hit_rate(self) -> float | None:
        sent = self.cache_n + self.prompt_n
        return self.cache_n / sent if sent else None

    @property
    def recompute_per_turn(self) -> float | None:
        return self.prompt_n / self.turns if self.turns else None


def summarize(requests: Sequence[Request]) -> PerfSummary:
    """Totals over the requests; self-tests are counted but left out of the cache figures."""
    summary = PerfSummary(requests=len(requests))
    turns: set[str] = set()
    for request in requests:
        record, perf = request.record, request.record.perf
        kind = record.kind.value
        summary.by_kind[kind] = summary.by_kind.get(kind, 0) + 1
        summary.capped += perf.capped
        summary.broken += perf.outcome == "broken"
        if record.kind is RequestKind.SELFTEST:
            continue
        summary.cache_n += perf.cache_n or 0
        summary.prompt_n += perf.prompt_n or 0
        if record.kind is RequestKind.TURN:
            turns.add(record.messages_sha256)
        if perf.cache_loss:
            tally = summary.losses.setdefault(perf.cache_loss_cause or "unexplained", LossTally())
            tally.requests += 1
            tally.tokens += perf.cache_loss
    summary.turns = len(turns)
    return summary


def format_summary(title: str, summary: PerfSummary) -> str:
    """A few readable lines: counts, hit rate, recompute per turn, losses by cause."""
    kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(summary.by_kind.items()))
    lines = [
        f"{title}: {summary.requests} requests" + (f" ({kinds})" if kinds else ""),
        f"  broken: {summary.broken}, capped: {summary.capped}",
    ]
    if summary.hit_rate is not None:
        sent = summary.cache_n + summary.prompt_n
        lines.append(
            f"  prompt cache hit rate: {summary.hit_rate:.1%} "
            f"({summary.cache_n:,} of {sent:,} prompt tokens reused)"
        )
    if summary.recompute_per_turn is not None:
        lines.append(
            f"  recompute per turn: {summary.recompute_per_turn:,.0f} tokens "
            f"({summary.turns} turns)"
        )
    if summary.losses:
        lines.append("  cache losses by cause:")
        for cause, tally in sorted(summary.losses.items(), key=lambda item: -item[1].tokens):
            noun = "request" if tally.requests == 1 else "requests"
            lines.append(f"    {cause:<28} {tally.requests:>4} {noun:<8} {tally.tokens:>9,} tokens")
    else:
        lines.append("  cache losses: none")
    return "\n".join(lines)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    perf = subparsers.add_parser("perf", help="per-request perf records: cache reuse, times")
    perf.add_argument("--session", help="one session (default: every session)")
    perf.add_argument("--json", action="store_true", help="the records as a JSON list")
    perf.set_defaults(handler=log_handler(run))


def run(args: argparse.Namespace, db_path: Path, out: TextIO, err: TextIO) -> int:
    """The ``perf`` command: 0 on success (no log yet is no sessions), 2 when the log cannot be
    read or has no such session."""
    try:
        with existing_log(db_path) as log:
            by_session = _requests(log, db_path, args.session)
    except LogError as exc:
        err.write(f"loopd: perf: {exc}\n")
        return EXIT_CANNOT
    if args.json:
        records = [r for name, rows in by_session.items() for r in perf_records(name, rows)]
        out.write(json.dumps(records, indent=2, ensure_ascii=False) + "\n")
        return 0
    if not by_session:
        out.write(f"no sessions in {db_path}\n")
    for name, rows in by_session.items():
        out.write(format_summary(f"session {name}", summarize(rows)) + "\n")
    if len(by_session) > 1:
        every = [r for rows in by_session.values() for r in rows]
        out.write(format_summary("all sessions", summarize(every)) + "\n")
    return 0


def _requests(
    log: SessionLog | None, db_path: Path, session: str | None
) -> dict[str, list[Request]]:
    if log is None and session is not None:
        raise UnknownSessionError(db_path, f"no session {session!r}")
    if log is None:
        return {}
    names = [session] if session else [s.name for s in log.sessions()]
    return {name: log.requests(name) for name in names}
