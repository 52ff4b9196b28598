"""Durable sessions in the soak: what the returns after a server kill re-read, and the save
folder against brokerd's cap. Pure: the run reads loopd's perf records (``loopd perf --json``'s
records) and samples the folder, these functions make the figures.

*A return after a server kill* is a session's first completed request, with the server's
counts, recorded after a kill of the llama-server child that holds the model and every cache
(the router starts it again on the next request), of a session that had such a request before
the kill. Only a completed request counts: one in flight at the kill broke with it, and its
retry is the return. Its *ideal* is what it had to read however well loopd did: its prompt less
what the session's previous request left in the slot (``expected_reuse``, the cache-loss
rule's expectation), so a return the server still held, or one restored from disk, re-reads
its ideal and a return read again in full re-reads its whole prompt.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from loopd.engine.cacheloss import LossCause
from loopd.engine.durable import Saved, worth_restoring

RESTORED = LossCause.RESTORED.value
NEW_EPOCH = LossCause.NEW_EPOCH.value
# brokerd's line when it removed saved states to keep the folder under its cap.
_EVICTED = re.compile(r"slot save folder over its cap: removed (\d+) files")


@dataclass(frozen=True)
class Request:
    """One perf record, as much of it as the figures read."""

    session: str
    at: float  # when it was recorded (it had ended), Unix time
    kind: str
    complete: bool
    cache_n: int | None
    prompt_n: int | None
    expected_reuse: int | None
    cause: str
    ttfb_ms: float | None

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Request:
        expected = record.get("expected_reuse")
        return cls(
            session=str(record["session"]),
            at=datetime.fromisoformat(str(record["created_at"])).timestamp(),
            kind=str(record["kind"]),
            complete=record.get("outcome") == "complete",
            cache_n=record.get("cache_n"),
            prompt_n=record.get("prompt_n"),
            expected_reuse=int(expected) if expected is not None else None,
            cause=str(record.get("cache_loss_cause") or ""),
            ttfb_ms=record.get("ttfb_ms"),
        )

    @property
    def counted(self) -> bool:
        """It carries the server's counts of a prompt it read (not a self-test's)."""
        return self.kind != "selftest" and self.cache_n is not None and self.prompt_n is not None

    @property
    def prompt(self) -> int:
        return (self.cache_n or 0) + (self.prompt_n or 0)

    @property
    def ideal(self) -> int:
        """The tokens it had to read: its prompt beyond what its session's previous request
        left in the slot (at least one: the server evaluates the last prompt token). A request
        that opens a new epoch (a compaction's summary and carried messages) extends no prompt
        the session ever sent: no slot and no save held more of it than the prefix the server
        kept, so it had to read everything it read (its ``expected_reuse`` is the previous
        request's length, which the cache-loss rule explains as the new epoch)."""
        if NEW_EPOCH in self.cause.split(", "):
            return max(self.prompt_n or 0, 1)
        reuse = self.expected_reuse or 0
        return max(self.prompt - reuse, 1)

    @property
    def restored(self) -> bool:
        return self.cause.split(", ")[0] == RESTORED

    @property
    def worth_restoring(self) -> bool:
        """The server had lost enough of what the session's previous request left that loopd's
        rule restores (``loopd.engine.durable.worth_restoring``), with what a save then held.
        A restored request counts: its first progress event, before the restore, said so."""
        if self.restored:
            return True
        held = self.expected_reuse or 0
        return held > 0 and worth_restoring(Saved("", 0, held, 0), self.cache_n or 0)


@dataclass(frozen=True)
class Returns:
    """The returns after server kills of one run, summed."""

    kills: int = 0
    returns: int = 0
    worth_restoring: int = 0  # those whose loss loopd's rule restores (the rest re-read little)
    restored: int = 0
    reread: int = 0  # prompt tokens the server evaluated on them (prompt_n)
    ideal: int = 0
    prompt: int = 0  # their prompts' tokens (cache_n + prompt_n)
    ttfb_ms: tuple[float, ...] = ()
    causes: tuple[tuple[str, int], ...] = ()  # the recorded cache-loss causes, most common first

    @property
    def over_ideal(self) -> float | None:
        """Re-read over ideal: 1.0 when every return read only its new tokens."""
        return self.reread / self.ideal if self.ideal else None

    @property
    def reread_share(self) -> float | None:
        """The share of the returns' prompt tokens the server read again."""
        return self.reread / self.prompt if self.prompt else None


def returns_after_kills(requests: Iterable[Request], kills: Sequence[float]) -> Returns:
    """Each session's first completed counted request after each kill, if the session had one
    before that kill (and so something to come back to)."""
    kills = sorted(kills)
    by_session: dict[str, list[Request]] = {}
    for request in requests:
        if request.counted:
            by_session.setdefault(request.session, []).append(request)
    found: list[Request] = []
    for rows in by_session.values():
        rows.sort(key=lambda r: r.at)
        for i, kill in enumerate(kills):
            before = [r for r in rows if r.at < kill]
            if not before:
                continue
            next_kill = kills[i + 1] if i + 1 < len(kills) else float("inf")
            back = next((r for r in rows if kill <= r.at < next_kill and r.complete), None)
            if back is not None:
                found.append(back)
    causes: dict[str, int] = {}
    for r in found:
        label = r.cause or "none (the slot held the session)"
        causes[label] = causes.get(label, 0) + 1
    return Returns(
        kills=len(kills),
        returns=len(found),
        worth_restoring=sum(r.worth_restoring for r in found),
        restored=sum(r.restored for r in found),
        reread=sum(r.prompt_n or 0 for r in found),
        ideal=sum(r.ideal for r in found),
        prompt=sum(r.prompt for r in found),
        ttfb_ms=tuple(sorted(r.ttfb_ms for r in found if r.ttfb_ms is not None)),
        causes=tuple(sorted(causes.items(), key=lambda item: (-item[1], item[0]))),
    )


@dataclass(frozen=True)
class Reuse:
    """Every counted request of a run: the cache's reuse, and the durable causes recorded."""

    requests: int = 0
    cache_n: int = 0
    prompt_n: int = 0
    by_cause: tuple[tuple[str, int], ...] = ()  # durable sessions' return causes

    @property
    def hit_rate(self) -> float | None:
        sent = self.cache_n + self.prompt_n
        return self.cache_n / sent if sent else None


def reuse(requests: Iterable[Request], durable_causes: Iterable[str]) -> Reuse:
    counted = [r for r in requests if r.counted]
    wanted = tuple(durable_causes)
    tally = {cause: 0 for cause in wanted}
    for r in counted:
        cause = r.cause.split(", ")[0]
        if cause in tally:
            tally[cause] += 1
    return Reuse(
        requests=len(counted),
        cache_n=sum(r.cache_n or 0 for r in counted),
        prompt_n=sum(r.prompt_n or 0 for r in counted),
        by_cause=tuple(tally.items()),
    )


@dataclass(frozen=True)
class Folder:
    """The server's save folder over the run, against brokerd's cap."""

    cap_bytes: int
    samples: tuple[tuple[float, int], ...] = ()  # (Unix time, bytes of loopd's files)
    end_bytes: int = 0  # once everything had stopped
    end_files: int = 0
    evicted_files: int = 0  # removed by brokerd to keep the cap

    @property
    def peak_bytes(self) -> int:
        return max((b for _, b in self.samples), default=0)

    @property
    def over_cap(self) -> int:
        """Samples that found the folder over its cap (between a save larger than any before
        it and brokerd's eviction after that save, the folder may be, for a moment)."""
        return sum(b > self.cap_bytes for _, b in self.samples)


def evicted_files(brokerd_log: str) -> int:
    """Saved states brokerd removed to keep the folder under its cap, from its log."""
    return sum(int(m[1]) for m in _EVICTED.finditer(brokerd_log))
