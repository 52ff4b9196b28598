"""The usage ledger: prompt and generated tokens and GPU seconds per person, channel and day,
derived from the session log's perf records. Pure.

Who a request is counted for: the person who started its turn, the author of the latest user
message before the entry that holds its answer (a Mattermost post is logged as ``@username:
message``; every message of a terminal session is the local user's). A request no entry holds (a
compaction, a prewarm) counts for the author of the latest user message recorded before it; one
before any message is loopd's own (``LOOPD_ITSELF``). Its day is the UTC date it was recorded.

What is counted, from each request's record:

- prompt tokens: the ones the server evaluated (``prompt_n``); those it took from its cache
  (``cache_n``) are counted apart, as cached tokens, since they cost next to no GPU time;
- generated tokens: ``predicted_n``;
- GPU seconds: the server's own prompt and generation times (``prompt_ms + predicted_ms``), the
  time the model ran for the request; a request the server sent no timings for counts none.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any, Final, TypeVar

from loopd.chat.labels import author_of
from loopd.sessionlog.records import Entry, EntryKind, Request

LOOPD_ITSELF: Final = "(loopd)"  # requests made before any message of the session
UNKNOWN_PERSON: Final = "(unknown)"  # a Mattermost message with no author line
TERMINAL_CHANNEL: Final = "terminal"

Key = TypeVar("Key")


@dataclass(frozen=True, order=True)
class UsageKey:
    day: str  # YYYY-MM-DD, UTC
    person: str
    channel: str


@dataclass
class UsageTotals:
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generated_tokens: int = 0
    gpu_seconds: float = 0.0

    def add(self, other: UsageTotals) -> None:
        self.requests += other.requests
        self.prompt_tokens += other.prompt_tokens
        self.cached_tokens += other.cached_tokens
        self.generated_tokens += other.generated_tokens
        self.gpu_seconds += other.gpu_seconds


Ledger = dict[UsageKey, UsageTotals]


def request_usage(request: Request) -> UsageTotals:
    perf = request.record.perf
    server_ms = sum(
        value
        for value in (perf.extra.get("prompt_ms"), perf.extra.get("predicted_ms"))
        if isinstance(value, int | float)
    )
    return UsageTotals(
        requests=1,
        prompt_tokens=perf.prompt_n or 0,
        cached_tokens=perf.cache_n or 0,
        generated_tokens=perf.predicted_n or 0,
        gpu_seconds=server_ms / 1000,
    )


def day_of(created_at: str) -> str:
    return datetime.fromisoformat(created_at).astimezone(UTC).date().isoformat()


def _speaker(entry: Entry, local_person: str | None) -> str:
    if local_person is not None:
        return local_person
    content = json.loads(entry.message or "{}").get("content")
    found = author_of(content) if isinstance(content, str) else None
    return found or UNKNOWN_PERSON


@dataclass
class Tally:
    """One session's usage counted so far, and what counting what it records next takes: its
    entries and its requests are read once each, in order (``read``, then ``count``), so a
    session is counted by what is new, never again from its start.

    ``local_person``: a terminal session's person; None for a Mattermost thread, whose people are
    read from its messages."""

    channel: str
    local_person: str | None = None
    ledger: Ledger = field(default_factory=dict)
    last_entry: int = 0  # the seq of the last entry read
    last_request: int = 0  # the row of the last request counted
    _person: str = LOOPD_ITSELF  # who spoke last in the entries read
    _said_at: list[str] = field(default_factory=list)  # when each user message was recorded
    _speakers: list[str] = field(default_factory=list)
    # Requests held by an entry read but not counted yet: the person each counts for.
    _held: dict[int, str] = field(default_factory=dict)

    def read(self, entries: Iterable[Entry]) -> None:
        """The session's entries after ``last_entry``, in order."""
        for entry in entries:
            if entry.kind is EntryKind.USER:
                self._person = _speaker(entry, self.local_person)
                self._said_at.append(entry.fields.created_at)
                self._speakers.append(self._person)
            if entry.fields.request_id is not None:
                self._held[entry.fields.request_id] = self._person
            self.last_entry = entry.fields.seq

    def count(self, requests: Iterable[Request]) -> None:
        """The session's requests after ``last_request``, in order, read after the entries that
        hold them (a request and its entry are written together)."""
        for request in requests:
            person = self._held.pop(request.id, None)
            if person is None:
                person = self._speaker_before(request.created_at)
            key = UsageKey(day_of(request.created_at), person, self.channel)
            self.ledger.setdefault(key, UsageTotals()).add(request_usage(request))
            self.last_request = request.id

    def _speaker_before(self, created_at: str) -> str:
        """Who spoke last before ``created_at``: a request no entry holds counts for them."""
        before = bisect.bisect_right(self._said_at, created_at)
        return self._speakers[before - 1] if before else LOOPD_ITSELF


def session_ledger(
    entries: Sequence[Entry],
    requests: Sequence[Request],
    *,
    channel: str,
    local_person: str | None = None,
) -> Ledger:
    """One session's usage: ``requests`` (all of the session's, or those of a span) counted by
    day and person, in ``channel``."""
    tally = Tally(channel, local_person)
    tally.read(entries)
    tally.count(requests)
    return tally.ledger


def merged(ledgers: Iterable[Ledger]) -> Ledger:
    out: Ledger = {}
    for ledger in ledgers:
        for key, usage in ledger.items():
            out.setdefault(key, UsageTotals()).add(usage)
    return out


def totals(
    ledger: Mapping[UsageKey, UsageTotals], by: Callable[[UsageKey], Key]
) -> dict[Key, UsageTotals]:
    """The ledger summed over what ``by`` leaves out (``lambda k: k.person``: per person)."""
    out: dict[Key, UsageTotals] = {}
    for key, usage in ledger.items():
        out.setdefault(by(key), UsageTotals()).add(usage)
    return out


def ledger_records(ledger: Mapping[UsageKey, UsageTotals]) -> list[dict[str, Any]]:
    """One JSON object per day, person and channel, in that order."""
    records = []
    for key in sorted(ledger):
        usage = asdict(ledger[key])
        usage["gpu_seconds"] = round(usage["gpu_seconds"], 3)
        records.append({**asdict(key), **usage})
    return records


_HEAD = ("day", "person", "channel", "requests", "prompt", "cached", "generated", "GPU s")


def format_ledger(ledger: Mapping[UsageKey, UsageTotals]) -> str:
    """A table, a row per day, person and channel, then each person's total over them."""
    if not ledger:
        return "no requests recorded"
    rows = [_row((key.day, key.person, key.channel), ledger[key]) for key in sorted(ledger)]
    per_person = totals(ledger, lambda key: key.person)
    rows.append(("",) * len(_HEAD))
    rows += [_row(("total", person, ""), per_person[person]) for person in sorted(per_person)]
    table = [_HEAD, *rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(_HEAD))]
    lines = []
    for row in table:
        left = [cell.ljust(width) for cell, width in zip(row[:3], widths, strict=False)]
        right = [cell.rjust(width) for cell, width in zip(row[3:], widths[3:], strict=True)]
        lines.append("  ".join(left + right).rstrip())
    return "\n".join(lines)


def _row(names: tuple[str, str, str], usage: UsageTotals) -> tuple[str, ...]:
    return (
        *names,
        f"{usage.requests:,}",
        f"{usage.prompt_tokens:,}",
        f"{usage.cached_tokens:,}",
        f"{usage.generated_tokens:,}",
        f"{usage.gpu_seconds:,.1f}",
    )
