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

The summary leads with the wait a person saw: from a turn asking for its slot to the first token
the model generated for it, in its four parts (``loopd.engine.waits``). Its text says what
happened in a person's words; the JSON keeps loopd's own names.

Two more figures need a definition:

- *hit rate*: prompt tokens the server reused over all prompt tokens it was sent,
  ``sum(cache_n) / sum(cache_n + prompt_n)``.
- *recompute per turn*: prompt tokens the server evaluated (``prompt_n``, retries and tool
  follow-ups included) over the number of turns. A turn is one set of messages sent as a
  ``turn`` request: its retries send the same bytes, so they count once.

Percentiles (p50 and p95, nearest rank) are over the turns or requests that have the figure: the
wait and its parts, ``prompt_n``, and generated tokens per second (the server's
``predicted_per_second``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from loopcommon.statuspage import duration
from loopd.engine.cacheloss import LossCause
from loopd.engine.waits import WAIT_PARTS, person_wait_ms
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
_EXTRA_FIELDS = (
    "expected_reuse",
    "failure",
    "detail",
    "status_code",
    "finish_reason",
    "restore",
    *WAIT_PARTS,
)


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
    if (wait := person_wait_ms(perf.extra)) is not None:
        out["wait_ms"] = wait
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
    waits_ms: list[float] = field(default_factory=list)  # the person's wait, one per turn
    wait_parts_ms: dict[str, list[float]] = field(default_factory=dict)  # by ``WAIT_PARTS``
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
        if (wait := person_wait_ms(perf.extra)) is not None:
            summary.waits_ms.append(wait)
            for name in WAIT_PARTS:
                summary.wait_parts_ms.setdefault(name, []).append(perf.extra[name])
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
    """A few readable lines: the wait a person saw first, then cache reuse, the requests, the
    server's speed, and the cache losses by what caused them."""
    kinds = [
        f"{summary.by_kind[k]} {words}" for k, words in KIND_WORDS.items() if k in summary.by_kind
    ]
    turns = "turn" if summary.turns == 1 else "turns"
    lines = [f"{title}: {summary.turns} {turns}, {_requests(summary.requests)} to the model"]
    lines += wait_lines(summary)
    if summary.hit_rate is not None:
        sent = summary.cache_n + summary.prompt_n
        reused = (
            f"  prompt cache: {summary.hit_rate:.1%} reused "
            f"({summary.cache_n:,} of {sent:,} prompt tokens)"
        )
        if summary.recompute_per_turn is not None:
            reused += f"; {summary.recompute_per_turn:,.0f} tokens read per turn"
        lines.append(reused)
    failed = f"{summary.broken} failed" if summary.broken else "none failed"
    capped = f", {summary.capped} cut at the thinking cap" if summary.capped else ""
    lines.append(f"  requests: {', '.join(kinds) or 'none'}; {failed}{capped}")
    if summary.by_endpoint:
        where = ", ".join(f"{name} {n}" for name, n in summary.by_endpoint.items())
        lines.append(f"  requests by server: {where}")
    lines += percentile_lines(summary)
    if summary.returns:
        said = ", ".join(
            f"{summary.returns[c]} {cause_words(c)}" for c in RETURN_CAUSES if c in summary.returns
        )
        lines.append(f"  returns after the server lost a session: {said}")
    if summary.losses:
        lines.append("  prompt tokens read again, by cause:")
        for cause, tally in sorted(summary.losses.items(), key=lambda item: -item[1].tokens):
            lines.append(
                f"    {cause_words(cause)}: {_requests(tally.requests)}, {tally.tokens:,} tokens"
            )
    else:
        lines.append("  prompt tokens read again: none")
    return "\n".join(lines)


def _requests(n: int) -> str:
    return f"{n} request" if n == 1 else f"{n} requests"


# What each kind of request is, in a person's words.
KIND_WORDS = {
    RequestKind.TURN.value: "for a message",
    RequestKind.TOOL_FOLLOWUP.value: "after tool calls",
    RequestKind.COMPACTION.value: "to compact a conversation",
    RequestKind.PREWARM.value: "to read a conversation ahead",
    RequestKind.SELFTEST.value: "self-test",
}

# What each cache-loss cause means, in a person's words (the records keep loopd's names).
CAUSE_WORDS: dict[str, str] = {
    LossCause.FIRST: "the conversation's first request",
    LossCause.NEW_EPOCH: "the conversation was compacted, or its tools changed",
    LossCause.CAPPED_TURN: "the turn before was cut at the thinking cap",
    LossCause.BROKEN_TURN: "the request before failed",
    LossCause.TEMPLATE_DROPS_REASONING: "the template drops earlier thinking",
    LossCause.COLD: "the server had forgotten it (restarted, or another model ran)",
    LossCause.OTHER_SLOT: "it moved to another of the server's places",
    LossCause.SHARED_SLOT: "another conversation used its place on the server",
    LossCause.SLOT_CLEARED: "the server cleared its place for another conversation",
    LossCause.NOT_IN_HOST_CACHE: "not in the server's memory (restarted, unloaded or evicted)",
    LossCause.SHARED_HEAD: "another conversation was in its place (only the shared start kept)",
    LossCause.CHECKPOINT: "the server went back to a checkpoint",
    LossCause.ENDPOINT_LOST: "its server died, and it moved to another",
    LossCause.RESTORED: "put back from disk",
    LossCause.RESTORE_REFUSED: "putting it back from disk was refused",
    LossCause.RESTORE_UNCONFIRMED: "putting it back from disk did not hold",
    LossCause.SERVER_RESTARTED: "the server restarted",
    LossCause.REPLY_TRIMMED: "the reply reads back shorter than generated",
    LossCause.UNEXPLAINED: "unexplained",
}


def cause_words(cause: str) -> str:
    """A recorded cause (``"new epoch"``, or two joined by ", ": a cause and the checkpoint the
    server went back to) in a person's words; one loopd does not know, as recorded."""
    words = [CAUSE_WORDS.get(part, part) for part in cause.split(", ") if part]
    return "; ".join(words) or CAUSE_WORDS[LossCause.UNEXPLAINED]


PERCENTILES = (50, 95)


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank percentile ``q`` (0-100] of ``values`` (not empty)."""
    ordered = sorted(values)
    rank = max(math.ceil(q / 100 * len(ordered)), 1)
    return ordered[rank - 1]


# The parts of the wait, in a person's words, in order.
PART_WORDS = {
    "loopd_queue_ms": "in loopd's queue",
    "server_queue_ms": "in the server's queue",
    "prompt_read_ms": "reading the prompt",
    "first_token_ms": "the first token",
}


def wait_lines(summary: PerfSummary) -> list[str]:
    """The wait for the first token over the turns that recorded it, then its parts."""
    if not summary.waits_ms:
        return []
    n = len(summary.waits_ms)
    lines = [
        f"  wait for the first token: {_spread(summary.waits_ms, duration)} "
        f"({n} {'turn' if n == 1 else 'turns'})"
    ]
    parts = [
        f"{PART_WORDS[name]} {_spread(summary.wait_parts_ms[name], duration)}"
        for name in WAIT_PARTS
    ]
    lines.append("    of which " + "; ".join(parts))
    return lines


def _spread(values: Sequence[float], shape: Callable[[float], str]) -> str:
    return ", ".join(f"p{q} {shape(percentile(values, q))}" for q in PERCENTILES)


def percentile_lines(summary: PerfSummary) -> list[str]:
    """One line per figure that some request has: p50 and p95, and how many it is over."""
    figures: tuple[tuple[str, Sequence[float], Callable[[float], str]], ...] = (
        ("prompt tokens read per request", summary.prompt_ns, "{:,.0f}".format),
        ("tokens generated per second", summary.tokens_per_s, "{:,.1f}".format),
    )
    lines = []
    for name, values, shape in figures:
        if values:
            lines.append(f"  {name}: {_spread(values, shape)} ({_requests(len(values))})")
    return lines


def session_table(by_session: Mapping[str, PerfSummary]) -> str:
    """One line per session: its turns, the wait for the first token, cache reuse, failures."""
    width = max([len("SESSION"), *(len(name) for name in by_session)])
    lines = [
        f"{'SESSION':<{width}}  {'TURNS':>5}  {'WAIT p50':>9}  {'WAIT p95':>9}  REUSED  FAILED"
    ]
    for name, summary in by_session.items():
        waits = summary.waits_ms
        p50, p95 = (duration(percentile(waits, q)) if waits else "-" for q in PERCENTILES)
        reused = f"{summary.hit_rate:.1%}" if summary.hit_rate is not None else "-"
        lines.append(
            f"{name:<{width}}  {summary.turns:>5}  {p50:>9}  {p95:>9}  {reused:>6}  "
            f"{summary.broken:>6}"
        )
    return "\n".join(lines)
