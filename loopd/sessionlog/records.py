"""Typed rows of the session log: what goes in and what comes out.

These are plain frozen dataclasses; the store maps them to and from SQL, and the pure modules
(``replay``, ``state``, ``chain``, ``verify``) work on them without touching the database.
"""

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any

from loopd.wire.assemble import ToolCall


class EntryKind(StrEnum):
    EPOCH = "epoch"  # opens an epoch; its message is the epoch's system message
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"
    BROKEN = "broken"  # a stream that did not finish: kept for diagnosis, never replayed
    NOTE = "note"  # an operator note or a correction of an earlier entry, never replayed


REPLAYED_KINDS = frozenset({EntryKind.EPOCH, EntryKind.USER, EntryKind.ASSISTANT, EntryKind.TOOL})


class NoteReason(StrEnum):
    """A note whose reason is one of these changes what the log's derivations say (a note with
    no reason, or another, is only read): ``loopd.sessionlog.state`` and the replay honour them.
    """

    # The turn under way ended without an answer (a request failed, a time limit, the repeat
    # guard, the round limit) and is final: it never runs again unless taken back. Its text is
    # the line the person was shown.
    TURN_ENDED = "turn ended"
    # The entry ``refers_to`` no longer counts: an answer leaves the replay (it is generated
    # again from the same prefix: a regenerate), or a turn's end (a stop, a ``TURN_ENDED``
    # note) no longer ends it (the turn is run again).
    TAKEN_BACK = "taken back"


# The reason of a broken entry that records a person's stop (``loopd.turnstop``).
STOPPED_BY = "stopped by "


class RequestKind(StrEnum):
    TURN = "turn"
    TOOL_FOLLOWUP = "tool_followup"
    SELFTEST = "selftest"
    COMPACTION = "compaction"
    PREWARM = "prewarm"


# Requests of these kinds send the session's replayed messages and must keep replay identity;
# a self-test sends its own probes.
REPLAYING_REQUEST_KINDS = frozenset(set(RequestKind) - {RequestKind.SELFTEST})


def fresh_external_key() -> str:
    """An intake key for a message with no natural one (a terminal message)."""
    return f"local-{uuid.uuid4().hex}"


@dataclass(frozen=True, slots=True)
class Session:
    id: int
    name: str
    slot: int
    created_at: str


@dataclass(frozen=True, slots=True)
class Epoch:
    id: int
    session_id: int
    number: int
    reason: str
    tools_text: str
    tools_sha256: str
    system_text: str
    created_at: str


@dataclass(frozen=True, slots=True)
class EntryFields:
    """What an entry says: everything the hash chain covers besides the previous hash.

    The one definition of an entry's fields: the store maps rows to and from them by name, and
    the hash covers them in this order, so they are never reordered (a stored chain would no
    longer verify; ``tests/sessionlog/test_sessionlog_upgrade.py`` checks one written by 0.1.0).
    """

    seq: int
    epoch_number: int
    kind: EntryKind
    message: str | None  # the serialized message, exactly as replayed (replayed kinds only)
    text: str | None  # not replayed: a note's text, a broken stream's partial text
    reason: str | None  # an epoch's or a broken stream's reason
    external_key: str | None
    tool_call_id: str | None
    # The row of the request that made the entry (``requests.id``), shown as ``request_row``:
    # the column keeps the name the first schema gave it, and ``request_id`` elsewhere is the
    # hex id of the request's log lines (``loopd.requestscope``).
    request_id: int | None
    refers_to: int | None  # the seq of an entry this one corrects or copies
    tools_sha256: str | None  # epoch entries: the epoch's tools hash
    created_at: str

    def values(self) -> tuple[object, ...]:
        """The fields in order, as the hash chain covers them."""
        return tuple(getattr(self, name) for name in ENTRY_FIELDS)


ENTRY_FIELDS = tuple(f.name for f in fields(EntryFields))


@dataclass(frozen=True, slots=True)
class Entry:
    id: int
    session_id: int
    fields: EntryFields
    prev_hash: str
    hash: str

    @property
    def seq(self) -> int:
        return self.fields.seq

    @property
    def kind(self) -> EntryKind:
        return self.fields.kind

    @property
    def message(self) -> str | None:
        return self.fields.message


@dataclass(frozen=True, slots=True)
class Appended:
    """The result of an idempotent append: the entry, and whether this call created it."""

    entry: Entry
    is_new: bool


@dataclass(frozen=True, slots=True)
class Perf:
    """How a request went, as reported by the server and measured by the turn engine."""

    outcome: str = "ok"
    cache_n: int | None = None
    prompt_n: int | None = None
    predicted_n: int | None = None
    ttfb_ms: float | None = None
    queue_wait_ms: float | None = None
    prompt_per_second: float | None = None
    predicted_per_second: float | None = None
    thinking_tokens: int | None = None
    capped: bool = False
    cache_loss: int | None = None  # tokens re-read that the previous request had cached
    cache_loss_cause: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)  # stored as a JSON object


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """A request to record: what it sent (count and digest of its messages) and how it went.

    ``messages_sha256`` is ``chain.messages_digest`` of the messages actually sent, which is the
    sha256 of the request's ``messages`` array bytes.
    """

    kind: RequestKind
    slot: int
    epoch: int  # the epoch number the request was built from
    message_count: int
    messages_sha256: str
    perf: Perf = field(default_factory=Perf)


@dataclass(frozen=True, slots=True)
class Request:
    id: int
    session_id: int
    record: RequestRecord
    created_at: str


@dataclass(frozen=True, slots=True)
class InterruptedCall:
    """A tool call of the latest assistant entry that has no result entry."""

    call: ToolCall  # as stored: its id, name and argument text exactly as streamed
    assistant_seq: int  # the assistant entry that made the call

    @property
    def call_id(self) -> str:
        return self.call.id

    @property
    def name(self) -> str:
        return self.call.name


@dataclass(frozen=True, slots=True)
class SessionState:
    """What a session is waiting for, derived from its rows (never stored)."""

    session: str
    # A turn is to run: the last replayed entry is a user message or a tool result (or an answer
    # was taken back), and nothing ended the turn since.
    pending_turn: bool
    interrupted_calls: tuple[InterruptedCall, ...]  # tool calls with no result
    broken_since: tuple[Entry, ...]  # broken-stream records after the last replayed entry
    # What ended the latest turn without an answer, for good: a person's stop (a broken entry)
    # or a ``TURN_ENDED`` note. None when the latest turn answered, or has not ended.
    ended_by: Entry | None = None
    # The latest replayed entry, when it is an answer (an assistant message without tool calls).
    answer: Entry | None = None

    @property
    def idle(self) -> bool:
        return not self.pending_turn and not self.interrupted_calls
