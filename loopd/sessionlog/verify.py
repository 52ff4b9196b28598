"""``loopd log verify``: recompute the hash chain and check replay identity.

The checks are pure functions of a session's rows (``check_session``); ``verify`` only reads them.
Replay identity: every request of an epoch sent a prefix of the epoch's messages (its recorded
digest equals the digest of that prefix as stored now), and each request sent at least as many
messages as the one before it, so every message it sent is, byte for byte, at the same position in
the next request. An answer taken back (a regenerate) leaves the replay: the requests after it
extend the messages before it (``ReplayViews``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from loopd.sessionlog import chain, replay
from loopd.sessionlog.migrations import expected_triggers
from loopd.sessionlog.records import (
    REPLAYED_KINDS,
    REPLAYING_REQUEST_KINDS,
    Entry,
    EntryKind,
    Epoch,
    Request,
    RequestKind,
    Session,
)
from loopd.sessionlog.state import is_take_back, taken_back
from loopd.sessionlog.store import SessionLog

_ROLE_OF_KIND = {
    EntryKind.EPOCH: "system",
    EntryKind.USER: "user",
    EntryKind.ASSISTANT: "assistant",
    EntryKind.TOOL: "tool",
}
_SLOT_BOUND_KINDS = frozenset({RequestKind.TURN, RequestKind.TOOL_FOLLOWUP, RequestKind.PREWARM})


@dataclass(frozen=True, slots=True)
class Problem:
    session: str | None  # None for a problem of the whole file
    where: str  # "entry 17", "request 4", "epoch 2", "schema"
    detail: str

    def __str__(self) -> str:
        scope = "database" if self.session is None else f"session {self.session!r}"
        return f"{scope} {self.where}: {self.detail}"


def verify(log: SessionLog, session: str | None = None) -> list[Problem]:
    """Every problem found, in order; the first one is the first offending row."""
    problems = [Problem(None, "file", detail) for detail in log.integrity_problems()[:5]]
    targets = [log.get_session(session)] if session is not None else log.sessions()
    for target in targets:
        problems += check_session(
            target,
            log.epochs(target.name),
            log.entries(target.name),
            log.requests(target.name),
        )
    missing = sorted(expected_triggers() - log.trigger_names())
    if missing:
        problems.append(Problem(None, "schema", f"append-only triggers missing: {missing}"))
    return problems


def check_session(
    session: Session,
    epochs: Sequence[Epoch],
    entries: Sequence[Entry],
    requests: Sequence[Request],
) -> list[Problem]:
    return [
        *check_chain(session, entries),
        *check_messages(session, entries),
        *check_epochs(session, epochs, entries),
        *check_requests(session, entries, requests),
    ]


def check_chain(session: Session, entries: Sequence[Entry]) -> list[Problem]:
    problems: list[Problem] = []
    prev_hash = chain.genesis_hash(session.name, session.slot)
    for position, entry in enumerate(entries, start=1):
        where = f"entry {entry.seq}"
        if entry.seq != position:
            problems.append(Problem(session.name, where, f"expected seq {position} (a gap?)"))
        if entry.prev_hash != prev_hash:
            problems.append(Problem(session.name, where, "does not chain to the entry before it"))
        if chain.entry_hash(entry.prev_hash, entry.fields) != entry.hash:
            problems.append(Problem(session.name, where, "content does not match its hash"))
        prev_hash = entry.hash
    return problems


def check_messages(session: Session, entries: Sequence[Entry]) -> list[Problem]:
    problems: list[Problem] = []
    for entry in entries:
        if entry.kind not in REPLAYED_KINDS:
            continue
        role = _role_of(entry.message)
        if role != _ROLE_OF_KIND[entry.kind]:
            problems.append(
                Problem(
                    session.name,
                    f"entry {entry.seq}",
                    f"{entry.kind.value} entry does not hold a {_ROLE_OF_KIND[entry.kind]} message",
                )
            )
    return problems


def _role_of(message: str | None) -> object:
    try:
        parsed = json.loads(message or "")
    except json.JSONDecodeError:
        return None
    return parsed.get("role") if isinstance(parsed, dict) else None


def check_epochs(
    session: Session, epochs: Sequence[Epoch], entries: Sequence[Entry]
) -> list[Problem]:
    problems: list[Problem] = []
    openers = {e.fields.epoch_number: e for e in entries if e.kind is EntryKind.EPOCH}
    for position, epoch in enumerate(epochs, start=1):
        where = f"epoch {epoch.number}"
        opener = openers.get(epoch.number)
        first = next((e for e in entries if e.fields.epoch_number == epoch.number), None)
        if epoch.number != position:
            problems.append(Problem(session.name, where, f"expected epoch number {position}"))
        if chain.sha256_text(epoch.tools_text) != epoch.tools_sha256:
            problems.append(Problem(session.name, where, "tools text does not match its sha256"))
        if opener is None or opener is not first:
            problems.append(Problem(session.name, where, "does not open with an epoch entry"))
            continue
        if opener.fields.tools_sha256 != epoch.tools_sha256:
            problems.append(
                Problem(session.name, f"entry {opener.seq}", "tools hash differs from its epoch")
            )
        if opener.message != replay.system_message(epoch.system_text):
            problems.append(
                Problem(session.name, f"entry {opener.seq}", "system message differs from epoch")
            )
    return problems


def check_requests(
    session: Session, entries: Sequence[Entry], requests: Sequence[Request]
) -> list[Problem]:
    problems: list[Problem] = []
    by_epoch: dict[int, list[Request]] = {}
    # Where loopd runs several servers, a request names its endpoint, and the session keeps one
    # slot on each endpoint it ran on (loopd.endpoints.serving): the first one it used there.
    endpoint_slots: dict[str, int] = {}
    for request in requests:
        record = request.record
        endpoint = record.perf.extra.get("endpoint")
        if record.kind in _SLOT_BOUND_KINDS and isinstance(endpoint, str):
            slot = endpoint_slots.setdefault(endpoint, record.slot)
            if record.slot != slot:
                problems.append(
                    Problem(
                        session.name,
                        f"request {request.id}",
                        f"sent to slot {record.slot} on endpoint {endpoint}; the session's slot "
                        f"there is {slot}",
                    )
                )
        elif record.kind in _SLOT_BOUND_KINDS and record.slot != session.slot:
            problems.append(
                Problem(
                    session.name,
                    f"request {request.id}",
                    f"sent to slot {record.slot}; the session's slot is {session.slot}",
                )
            )
        if record.kind in REPLAYING_REQUEST_KINDS:
            by_epoch.setdefault(record.epoch, []).append(request)
    for epoch_number, epoch_requests in by_epoch.items():
        epoch_entries = [e for e in entries if e.fields.epoch_number == epoch_number]
        views = ReplayViews.of(epoch_entries, {r.record.message_count for r in epoch_requests})
        problems += _check_replay_identity(session, views, epoch_requests)
    return problems


@dataclass(frozen=True, slots=True)
class ReplayViews:
    """What an epoch's requests may have sent: its messages as replayed at any moment.

    The replay only grows, but for an answer taken back (``NoteReason.TAKEN_BACK``: a
    regenerate), which leaves it from its end: each moment's messages are a prefix of the
    messages as they stood after some append. So ``digests[n]`` holds the digest of every list of
    ``n`` messages the replay held (one, where nothing was taken back), ``longest`` the most it
    held, and ``cut_to`` the lengths a take-back cut it back to.
    """

    digests: dict[int, set[str]]
    longest: int
    cut_to: frozenset[int]

    @classmethod
    def of(cls, entries: Sequence[Entry], counts: set[int]) -> ReplayViews:
        taken = taken_back(entries)
        if not taken:  # one pass over the bytes, for the wanted lengths only
            messages = [e.message for e in entries if e.message is not None]
            found = chain.prefix_digests(messages, counts)
            return cls({n: {d} for n, d in found.items()}, len(messages), frozenset())
        digests: dict[int, set[str]] = {}
        stack: list[tuple[int, Any]] = []  # (seq, the running digest after that message)
        longest, cut_to = 0, set()
        empty = chain.running_digest()
        if 0 in counts:
            digests[0] = {chain.closed_digest(empty)}
        for entry in entries:
            if entry.message is not None:
                running = chain.extended(stack[-1][1] if stack else empty, entry.message, not stack)
                stack.append((entry.seq, running))
                longest = max(longest, len(stack))
                if len(stack) in counts:
                    digests.setdefault(len(stack), set()).add(chain.closed_digest(running))
            elif is_take_back(entry) and stack and stack[-1][0] == entry.fields.refers_to:
                stack.pop()
                cut_to.add(len(stack))
        return cls(digests, longest, frozenset(cut_to))


def _check_replay_identity(
    session: Session, views: ReplayViews, requests: Sequence[Request]
) -> list[Problem]:
    problems: list[Problem] = []
    previous: Request | None = None
    for request in requests:
        record = request.record
        where = f"request {request.id}"
        if record.message_count > views.longest:
            problems.append(
                Problem(
                    session.name,
                    where,
                    f"sent {record.message_count} messages; epoch {record.epoch} holds only "
                    f"{views.longest}",
                )
            )
        elif record.messages_sha256 not in views.digests.get(record.message_count, set()):
            problems.append(
                Problem(
                    session.name,
                    where,
                    f"its {record.message_count} messages are not, byte for byte, the first "
                    f"{record.message_count} messages of epoch {record.epoch} as stored",
                )
            )
        shorter = previous is not None and record.message_count < previous.record.message_count
        # Fewer than the request before is a request that did not extend it, but where an
        # answer was taken back: then exactly the messages before that answer.
        if previous is not None and shorter and record.message_count not in views.cut_to:
            problems.append(
                Problem(
                    session.name,
                    where,
                    f"sent {record.message_count} messages, fewer than request {previous.id} "
                    f"({previous.record.message_count}): it did not extend it",
                )
            )
        previous = request
    return problems
