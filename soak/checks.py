"""The end-of-run checks, from the outside: the users' ledger, the fake Mattermost's post log
and loopd's session log (as ``loopd log export`` gives it). Pure: every input is data.

A message is *covered* by the first turn that ends after it in its session's log (messages that
came during a turn wait for the next one, which answers them together): an answer, a stop, or,
when no turn ended after it, the error post of the turn that failed on it. It is *lost* when it
was never stored and got no notice saying why, or when what covers it never reached its thread.
It is *answered twice* when a reply key was posted twice, or when a turn ended in an answer with
no new message to answer.

Only a run that settled (every turn over) can call a message without its reply lost. When the run
stopped waiting first, a message loopd still holds (stored with its turn to come, or held in
``chat.db`` while its thread's turn ran) is *pending*: the run failed to settle, but loopd did not
lose it.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from soak.mattermost import LogEntry
from soak.users import Ledger, UserPost

OWN_KEY = "loopd-"  # external keys of the user entries loopd writes itself (compaction)
COMPACTION_KEY = "loopd-compaction"
NOTICE_PREFIXES = ("full:", "files:", "refuse:", "cut:")
STOPPED = "stopped by "
_STATUS = re.compile(r":status(\.\d+)?$")
_FAILED = re.compile(r"(.+)#(\d+):failed")


@dataclass(frozen=True)
class Row:
    """One entry of ``loopd log export``, as much of it as the checks read."""

    seq: int
    kind: str
    message: dict[str, Any] | None
    external_key: str | None
    reason: str | None
    refers_to: int | None

    @classmethod
    def from_export(cls, raw: dict[str, Any]) -> Row:
        message = raw.get("message")
        return cls(
            int(raw["seq"]),
            str(raw["kind"]),
            json.loads(message) if isinstance(message, str) else None,
            raw.get("external_key"),
            raw.get("reason"),
            raw.get("refers_to"),
        )

    @property
    def user_message(self) -> bool:
        """A message a person sent (not one compaction wrote or carried)."""
        return self.kind == "user" and not (self.external_key or "").startswith(OWN_KEY)


@dataclass(frozen=True)
class Session:
    name: str
    slot: int
    rows: tuple[Row, ...]

    @cached_property
    def ends(self) -> list[Row]:
        return turn_ends(self.rows)


def turn_ends(rows: tuple[Row, ...]) -> list[Row]:
    """The entries that end a turn: an answer (an assistant message without tool calls that is
    neither a copy nor a compaction summary) or a stop."""
    ends = []
    # After a compaction's instruction the next assistant entry is the summary, even when
    # messages came between (a compaction cut short by a kill, finished after they were stored).
    summary_asked = False
    for row in rows:
        if row.kind == "user" and (row.external_key or "").startswith(COMPACTION_KEY):
            summary_asked = True
        elif row.kind == "epoch":
            # The compaction is over, its summary written or not (its request may have broken
            # and an excerpt stand in): what the new epoch's model writes is an answer.
            summary_asked = False
        elif row.kind == "assistant":
            answer = row.message is not None and not row.message.get("tool_calls")
            if answer and row.refers_to is None and not summary_asked:
                ends.append(row)
            summary_asked = False
        elif row.kind == "broken" and (row.reason or "").startswith(STOPPED):
            ends.append(row)
    return ends


@dataclass
class Thread:
    """The bot's posts by reply key as the fake logged them: when each key first appeared, which
    posts carried it, and each session's error posts (seq of the failed turn, when, key)."""

    first_at: dict[tuple[str, int], float] = field(default_factory=dict)
    posts: dict[tuple[str, int], set[str]] = field(default_factory=dict)
    failed: dict[str, list[tuple[int, float, str]]] = field(default_factory=dict)


def bot_keys(entries: list[LogEntry], bot_id: str) -> Thread:
    """Every (reply key, part) the bot's posts carried, the posts that carried each, and when
    each key first appeared (a draft edited into an answer carries it from that edit on)."""
    seen = Thread()
    for entry in entries:
        if entry.user_id != bot_id or entry.action not in ("created", "edited") or not entry.key:
            continue
        slot = (entry.key, entry.part if entry.part is not None else 0)
        if slot not in seen.first_at and (failed := _FAILED.fullmatch(entry.key)):
            seen.failed.setdefault(failed[1], []).append((int(failed[2]), entry.at, entry.key))
        seen.first_at.setdefault(slot, entry.at)
        seen.posts.setdefault(slot, set()).add(entry.post_id)
    return seen


@dataclass
class Coverage:
    post: UserPost
    how: str  # answer, stopped, error, notice, pending, lost
    key: str = ""
    at: float | None = None
    why: str = ""


@dataclass
class Verdict:
    coverage: list[Coverage] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)
    answered_twice: list[str] = field(default_factory=list)
    stored_twice: list[str] = field(default_factory=list)
    error_then_answered: int = 0
    answers: int = 0
    stops: int = 0
    errors: int = 0
    edits_acknowledged: int = 0
    stop_posts: int = 0

    @property
    def turns(self) -> int:
        return self.answers + self.stops + self.errors


def check_messages(
    ledger: Ledger,
    entries: list[LogEntry],
    bot_id: str,
    sessions: list[Session],
    *,
    settled: bool = True,
    held: frozenset[str] = frozenset(),
) -> Verdict:
    """``settled``: every turn had ended when loopd was stopped; ``held``: post ids loopd's chat
    state still held (not yet in the log) when it was stopped."""
    verdict = Verdict()
    keys = bot_keys(entries, bot_id)
    post_time = {e.post_id: e.at for e in entries if e.action == "created"}
    closing = {
        k for (k, _part) in keys.first_at if not k.endswith(":draft") and not _STATUS.search(k)
    }
    for (key, part), posts in keys.posts.items():
        if key in closing and len(posts) > 1:
            verdict.answered_twice.append(f"{key} part {part} posted {len(posts)} times")
    stored: dict[str, list[tuple[Session, Row]]] = {}
    for session in sessions:
        for row in session.rows:
            if row.user_message and row.external_key:
                stored.setdefault(row.external_key, []).append((session, row))
    _count_turns(verdict, sessions, keys, closing)
    for post in ledger.posts:
        at = post_time.get(post.post_id, post.at)
        post = _at(post, at)
        if post.kind == "stop":
            verdict.stop_posts += 1
            verdict.coverage.append(_cover_stop(post, keys))
            continue
        places = stored.get(post.post_id, [])
        if len(places) > 1:
            verdict.stored_twice.append(
                f"{post.post_id} ({post.thread}) stored {len(places)} times"
            )
        if not places:
            cover = _cover_unstored(post, keys)
            if cover.how == "lost" and post.post_id in held:
                cover = Coverage(post, "lost", why="held by loopd, never taken in")
                if not settled:
                    cover = Coverage(
                        post, "pending", why="held by loopd for its thread's next turn"
                    )
            verdict.coverage.append(cover)
            continue
        session, row = places[0]
        cover = _cover_stored(post, session, row, keys)
        if cover.how == "lost" and not settled:  # its turn, or its delivery, was still to come
            cover = Coverage(post, "pending", cover.key, why=cover.why)
        if cover.how == "answer" and _failed_between(session, row, cover, keys):
            verdict.error_then_answered += 1
        verdict.coverage.append(cover)
    for cover in verdict.coverage:
        line = f"{cover.post.post_id} ({cover.post.thread}): {cover.why}"
        if cover.how == "lost":
            verdict.lost.append(line)
        elif cover.how == "pending":
            verdict.pending.append(line)
    _check_edits(verdict, ledger, sessions, keys)
    return verdict


def _at(post: UserPost, at: float) -> UserPost:
    return UserPost(post.post_id, post.thread, post.root_id, post.user, post.kind, post.text, at)


def _count_turns(
    verdict: Verdict, sessions: list[Session], keys: Thread, closing: set[str]
) -> None:
    """Turns that ended, and answers that answered nothing new (a turn run twice)."""
    log_keys = set()
    for session in sessions:
        previous = -1
        for end in session.ends:
            asked = [r for r in session.rows if previous < r.seq < end.seq and r.user_message]
            if end.kind == "assistant":
                verdict.answers += 1
                key = f"{session.name}#{end.seq}"
                log_keys.add(key)
                if not asked:
                    verdict.answered_twice.append(f"{key}: an answer with no new message before it")
            else:
                verdict.stops += 1
                log_keys.add(f"{session.name}#{end.seq}:stopped")
            previous = end.seq
    verdict.errors = sum(1 for k in closing if k.endswith(":failed"))
    for key in sorted(closing):
        if re.search(r"#\d+$", key) and key not in log_keys:
            verdict.answered_twice.append(f"{key}: posted, but no such answer in the log")


def _cover_stop(post: UserPost, keys: Thread) -> Coverage:
    notice = keys.first_at.get((f"stop:{post.post_id}", 0))
    if notice is not None:
        return Coverage(post, "notice", f"stop:{post.post_id}", notice)
    session = f"mm:{post.root_id}#"
    stopped = [
        (at, key)
        for (key, part), at in keys.first_at.items()
        if part == 0 and key.startswith(session) and key.endswith(":stopped") and at >= post.at
    ]
    if stopped:
        at, key = min(stopped)
        return Coverage(post, "stopped", key, at)
    return Coverage(post, "lost", why="a stop with neither a stop nor a notice")


def _cover_unstored(post: UserPost, keys: Thread) -> Coverage:
    for prefix in NOTICE_PREFIXES:
        at = keys.first_at.get((f"{prefix}{post.post_id}", 0))
        if at is not None:
            return Coverage(post, "notice", f"{prefix}{post.post_id}", at)
    return Coverage(post, "lost", why="never stored, and no notice said why")


def _cover_stored(post: UserPost, session: Session, row: Row, keys: Thread) -> Coverage:
    end = next((e for e in session.ends if e.seq > row.seq), None)
    if end is not None:
        key = f"{session.name}#{end.seq}" + ("" if end.kind == "assistant" else ":stopped")
        at = keys.first_at.get((key, 0))
        if at is None:
            return Coverage(post, "lost", key, why=f"covered by {key} in the log, never posted")
        return Coverage(post, "answer" if end.kind == "assistant" else "stopped", key, at)
    failed = _failed_after(session, row.seq, keys)
    if failed is not None:
        return Coverage(post, "error", failed[1], failed[0])
    return Coverage(post, "lost", why=f"stored as {session.name}#{row.seq}, never answered")


def _failed_after(session: Session, seq: int, keys: Thread) -> tuple[float, str] | None:
    """The first error post (``<session>#<n>:failed``, n > seq) of the session, if any."""
    found = [(at, key) for n, at, key in keys.failed.get(session.name, []) if n > seq]
    return min(found) if found else None


def _failed_between(session: Session, row: Row, cover: Coverage, keys: Thread) -> bool:
    failed = _failed_after(session, row.seq, keys)
    return failed is not None and cover.at is not None and failed[0] < cover.at


def _check_edits(verdict: Verdict, ledger: Ledger, sessions: list[Session], keys: Thread) -> None:
    """An edit of a message loopd had already read gets its one notice; a message first read
    after its edit is stored as edited, and needs none."""
    texts = {
        row.external_key: str((row.message or {}).get("content", ""))
        for s in sessions
        for row in s.rows
        if row.user_message and row.external_key
    }
    for post_id in sorted({edit.post_id for edit in ledger.edits}):
        if (f"edit:{post_id}", 0) in keys.first_at:
            verdict.edits_acknowledged += 1
            continue
        stored = texts.get(post_id)
        if stored is not None and not stored.endswith("(edited)"):
            verdict.lost.append(f"{post_id}: edited after it was read, and no edit notice came")


def tools_twice(marks: list[str]) -> list[str]:
    """Tool tags that ran more than once (the marks file has one line per run)."""
    return sorted(tag for tag, n in Counter(marks).items() if n > 1)


def percentile(values: list[float], share: float) -> float | None:
    """Nearest-rank percentile (``share`` in 0..1) of ``values``; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(share * len(ordered))))
    return ordered[rank - 1]


@dataclass(frozen=True)
class Latency:
    start: float  # the first message the turn covers was posted
    end: float  # its answer, stop or error reached the thread
    with_fault: bool

    @property
    def seconds(self) -> float:
        return self.end - self.start


FAULT_REACH_S = 15.0  # a fault this long before a turn began may still slow it (a restart)


def latencies(coverage: list[Coverage], fault_times: list[float]) -> list[Latency]:
    """One per turn that reached its thread: from its first message to its reply."""
    first: dict[str, tuple[float, float]] = {}
    for cover in coverage:
        if cover.how in ("answer", "stopped", "error") and cover.at is not None:
            start, end = first.get(cover.key, (cover.post.at, cover.at))
            first[cover.key] = (min(start, cover.post.at), end)
    return sorted(
        (
            Latency(
                start,
                end,
                any(start - FAULT_REACH_S <= t <= end for t in fault_times),
            )
            for start, end in first.values()
        ),
        key=lambda lat: lat.start,
    )


@dataclass(frozen=True)
class SlotWait:
    slot: int
    waits: tuple[float, ...]

    @property
    def mean(self) -> float:
        return sum(self.waits) / len(self.waits) if self.waits else 0.0

    @property
    def longest(self) -> float:
        return max(self.waits, default=0.0)


def slot_waits(entries: list[LogEntry], bot_id: str, slots: dict[str, int]) -> list[SlotWait]:
    """How long each turn waited for its slot: from its status post's creation to the first text
    that is no longer a wait in loopd's own line (or to the post's removal)."""
    opened: dict[str, tuple[float, str]] = {}
    waited: dict[int, list[float]] = {}
    for entry in entries:
        if entry.user_id != bot_id:
            continue
        if entry.action == "created" and _STATUS.search(entry.key):
            opened[entry.post_id] = (entry.at, entry.key.partition("#")[0])
            continue
        started = opened.get(entry.post_id)
        if started is None:
            continue
        if entry.action == "deleted" or not entry.message.startswith(
            ("⏳ starting", "⏳ waiting for its turn")
        ):
            slot = slots.get(started[1])
            if slot is not None:
                waited.setdefault(slot, []).append(entry.at - started[0])
            del opened[entry.post_id]
    return [SlotWait(slot, tuple(w)) for slot, w in sorted(waited.items())]
