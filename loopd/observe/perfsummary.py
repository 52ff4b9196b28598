"""The per-request perf records of the session log, as JSON records or as a summary. Pure.

``perf_records`` and ``summarize`` read ``Request`` rows (as the session log returns them) and
``format_summary`` writes text; ``loopd perf`` (``loopd.cli.perf``) and the status page show
them. The JSON keeps the server's own field names (``cache_n``, ``prompt_n``, ``predicted_n``) so a
record can be set beside the server's timings.

Each record names its request twice, each name with one meaning: ``request_id`` is the id the
request's lines in loopd's and brokerd's logs carry (16 hex digits; null for a request recorded
before loopd kept it), and ``request_row`` is its row in the session log's ``requests`` table (an
integer; ``loopd log show`` and ``loopd log export`` name it so too, on the entry that holds the
answer).

Where loopd has several servers, each record names the ``endpoint`` it ran on (null for the
one-server shorthand), and a summary counts the requests of each endpoint.

Two figures need a definition:

- *hit rate*: prompt tokens the server reused over all prompt tokens it was sent,
  ``sum(cache_n) / sum(cache_n + prompt_n)``.
- *recompute per turn*: prompt tokens the server evaluated (``prompt_n``, retries and tool
  follow-ups included) over the number of turns. A turn is one set of messages sent as a
  ``turn`` request: its retries send the same bytes, so they count once.

Percentiles (p50, p90, p99, nearest rank) are over the requests that have the figure: time to
first byte, ``prompt_n``, and generated tokens per second (the server's ``predicted_per_second``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from loopd.engine.cacheloss import LossCause
from loopd.sessionlog.records import Request, RequestKind

# A session's return after the server lost it, as durable sessions name it (a restore is named
# even when it left nothing to re-read).
RETURN_CAUSES = (
    LossCause.RESTORED,
    LossCause.RESTORE_REFUSED,
    LossCause.RESTORE_UNCONFIRMED,
    LossCause.SERVER_RESTARTED,
)

# Recorded in a request's ``extra`` by the turn engine; copied into the JSON when present.
_EXTRA_FIELDS = ("expected_reuse", "failure", "detail", "status_code", "finish_reason", "restore")


def perf_record(session: str, request: Request) -> dict[str, Any]:
    """One request as a flat JSON object, the server's counters under their own names."""
    record, perf = request.record, request.record.perf
    out: dict[str, Any] = {
        "session": session,
        "request_row": request.id,
        "request_id": request_id_of(request),
        "created_at": request.created_at,
        "kind": record.kind.value,
        "endpoint": endpoint_of(request),
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


def request_id_of(request: Request) -> str | None:
    """The id the request's lines in loopd's and brokerd's logs carry (``request_id``); None
    for a request recorded before loopd kept it, or one made outside a request's scope."""
    found = request.record.perf.extra.get("request_id")
    return found if isinstance(found, str) else None


def endpoint_of(request: Request) -> str | None:
    """The ``[[endpoint]]`` the request ran on; None for the one-server shorthand."""
    name = request.record.perf.extra.get("endpoint")
    return name if isinstance(name, str) else None


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
    by_endpoint: dict[str, int] = field(default_factory=dict)  # requests per named endpoint
    ttfb_ms: list[float] = field(default_factory=list)
    prompt_ns: list[int] = field(default_factory=list)
    tokens_per_s: list[float] = field(default_factory=list)
    returns: dict[str, int] = field(default_factory=dict)  # by ``RETURN_CAUSES``

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
        if (endpoint := endpoint_of(request)) is not None:
            summary.by_endpoint[endpoint] = summary.by_endpoint.get(endpoint, 0) + 1
        summary.capped += perf.capped
        summary.broken += perf.outcome == "broken"
        if record.kind is RequestKind.SELFTEST:
            continue
        summary.cache_n += perf.cache_n or 0
        summary.prompt_n += perf.prompt_n or 0
        if perf.ttfb_ms is not None:
            summary.ttfb_ms.append(perf.ttfb_ms)
        if perf.prompt_n is not None:
            summary.prompt_ns.append(perf.prompt_n)
        if perf.predicted_per_second is not None:
            summary.tokens_per_s.append(perf.predicted_per_second)
        if record.kind is RequestKind.TURN:
            turns.add(record.messages_sha256)
        cause = (perf.cache_loss_cause or "").split(", ")[0]
        if cause in RETURN_CAUSES:
            summary.returns[cause] = summary.returns.get(cause, 0) + 1
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
    if summary.by_endpoint:
        where = ", ".join(f"{name} {n}" for name, n in summary.by_endpoint.items())
        lines.append(f"  requests by endpoint: {where}")
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
    lines += percentile_lines(summary)
    if summary.returns:
        said = ", ".join(
            f"{summary.returns[c]} {c}" for c in RETURN_CAUSES if c.value in summary.returns
        )
        lines.append(f"  returns after the server lost a session: {said}")
    if summary.losses:
        lines.append("  cache losses by cause:")
        for cause, tally in sorted(summary.losses.items(), key=lambda item: -item[1].tokens):
            noun = "request" if tally.requests == 1 else "requests"
            lines.append(f"    {cause:<28} {tally.requests:>4} {noun:<8} {tally.tokens:>9,} tokens")
    else:
        lines.append("  cache losses: none")
    return "\n".join(lines)


PERCENTILES = (50, 90, 99)


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank percentile ``q`` (0-100] of ``values`` (not empty)."""
    ordered = sorted(values)
    rank = max(math.ceil(q / 100 * len(ordered)), 1)
    return ordered[rank - 1]


def percentile_lines(summary: PerfSummary) -> list[str]:
    """One line per figure that some request has: p50, p90 and p99, and how many it is over."""
    figures = (
        ("time to first byte", summary.ttfb_ms, "{:,.0f} ms"),
        ("prompt_n per request", summary.prompt_ns, "{:,.0f}"),
        ("generated tokens/s", summary.tokens_per_s, "{:,.1f}"),
    )
    lines = []
    for name, values, shape in figures:
        if not values:
            continue
        parts = ", ".join(f"p{q} {shape.format(percentile(values, q))}" for q in PERCENTILES)
        noun = "request" if len(values) == 1 else "requests"
        lines.append(f"  {name}: {parts} ({len(values)} {noun})")
    return lines
