"""The I/O shell of the session log: one SQLite file per state dir, written append-only.

Settings, and why:

- Opened as every SQLite file of loopd's and brokerd's is (``loopcommon.sqlitefile``): WAL
  journal, so readers (``loopd log ...``) never block the daemon's appends; ``synchronous=FULL``,
  since in WAL mode NORMAL survives a process crash but may lose the last commits on power loss,
  and the log is the only record of what was posted to a thread and sent to the server (a turn
  takes seconds, so one fsync per append is cheap insurance); foreign keys; the migrations. A
  foreign, newer or damaged file is refused first, unchanged (``_check_file``).
- Every write is one ``BEGIN IMMEDIATE`` transaction: an append reads the chain head then inserts,
  and taking the write lock up front makes a competing writer wait (busy timeout) instead of
  failing on a stale snapshot. A crash at any point leaves the rows of whole appends only.
- Triggers reject UPDATE and DELETE on every table (see ``migrations``); corrections are entries.
- Rows are mapped to records by column name (``_select``, and ``rows`` for each record).
"""

import json
import sqlite3
import threading
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime
from itertools import count
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from loopcommon.migrations import NewerSchemaError
from loopcommon.sqlitefile import UnusableFileError, open_sqlite
from loopd.sessionlog import chain, replay, rows
from loopd.sessionlog.assistant import MalformedAssistantError, tool_calls_of
from loopd.sessionlog.errors import (
    AppendOnlyError,
    CorruptLogError,
    DiskFullError,
    InvalidAppendError,
    InvalidMessageError,
    LockedError,
    LogError,
    LogNotFoundError,
    NoEpochError,
    NotALogError,
    SchemaTooNewError,
    SlotMismatchError,
    StorageError,
    ToolCallError,
    UnknownSessionError,
)
from loopd.sessionlog.migrations import APPLICATION_ID, MIGRATIONS
from loopd.sessionlog.records import (
    Appended,
    Entry,
    EntryFields,
    EntryKind,
    Epoch,
    NoteReason,
    Request,
    RequestKind,
    RequestRecord,
    Session,
    SessionState,
)
from loopd.sessionlog.state import derive_state, unanswered_calls

_COPIED_KINDS = frozenset({EntryKind.USER, EntryKind.ASSISTANT, EntryKind.TOOL})

SESSION_KINDS = frozenset(RequestKind) - {RequestKind.SELFTEST}
"""The requests that sent the session's own prompt (a self-test sends one of its own)."""


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


class SessionLog:
    """An open session log. Safe to share between threads (calls are serialized)."""

    def __init__(self, path: Path, conn: sqlite3.Connection, clock: Callable[[], str]) -> None:
        self.path = path
        self._conn = conn
        self._clock = clock
        self._lock = threading.RLock()
        self._sessions: dict[str, Session] = {}
        # The replayed messages of each session whose turn is under way (``holding_replay``):
        # its epoch id, the last seq read, the messages. Entries are never changed, so a build
        # reads only the rows appended since (one request costs its new rows, not the whole
        # epoch); an idle session holds none of its text.
        self._replayed: dict[str, tuple[int, int, list[tuple[int, str]]]] = {}
        self._holds: dict[str, int] = {}
        self._savepoints = count()

    # -- opening and closing -------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        path: Path,
        *,
        create: bool = True,
        busy_timeout_ms: int = 5000,
        clock: Callable[[], str] = utc_now,
    ) -> Self:
        """Open (and create or migrate) the log at ``path``; raises a ``StorageError`` naming it."""
        path = Path(path)
        if path.exists() and not path.is_file():
            raise NotALogError(path, "not a regular file")
        if not path.exists() and not create:
            raise LogNotFoundError(path, "no such file")
        try:
            conn = open_sqlite(
                path,
                migrations=MIGRATIONS,
                busy_timeout_s=busy_timeout_ms / 1000,
                check=lambda conn: _check_file(path, conn),
            )
        except sqlite3.Error as exc:
            raise translate_error(path, exc) from exc
        except UnusableFileError as exc:
            raise StorageError(path, str(exc)) from exc
        return cls(path, conn, clock)

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- transactions and error translation -----------------------------------------------------

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """Group writes into one transaction: all of them are kept, or none. Nestable."""
        with self._lock, self._guard():
            conn = self._conn
            if conn.in_transaction:
                name = f"sessionlog_{next(self._savepoints)}"
                conn.execute(f"SAVEPOINT {name}")
                try:
                    yield
                except BaseException:
                    if conn.in_transaction:
                        conn.execute(f"ROLLBACK TO {name}")
                        conn.execute(f"RELEASE {name}")
                    raise
                conn.execute(f"RELEASE {name}")
                return
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:  # SQLITE_FULL and others may have rolled back already
                    conn.execute("ROLLBACK")
                raise

    @contextmanager
    def _reading(self) -> Iterator[None]:
        with self._lock, self._guard():
            yield

    @contextmanager
    def _guard(self) -> Iterator[None]:
        try:
            yield
        except sqlite3.Error as exc:
            raise translate_error(self.path, exc) from exc

    def _select(self, sql: str, params: tuple[Any, ...] = ()) -> list[rows.Row]:
        """The rows of a query, each a mapping of column name to value."""
        cursor = self._conn.execute(sql, params)
        names = [column[0] for column in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    def _select_one(self, sql: str, params: tuple[Any, ...] = ()) -> rows.Row | None:
        found = self._select(sql, params)
        return found[0] if found else None

    def _insert(self, table: str, row: Mapping[str, Any]) -> int:
        cursor = self._conn.execute(rows.insert_sql(table, tuple(row)), row)
        return int(cursor.lastrowid or 0)

    # -- sessions -------------------------------------------------------------------------------

    def ensure_session(self, name: str, slot: int) -> Session:
        """The session called ``name``, created on first use; its slot is fixed for life."""
        if not name or slot < 0:
            raise InvalidAppendError(self.path, f"bad session {name!r} / slot {slot}")
        with self.transaction():
            existing = self._find_session(name)
            if existing is not None:
                if existing.slot != slot:
                    raise SlotMismatchError(
                        self.path,
                        f"session {name!r} uses slot {existing.slot} for life, not {slot}",
                    )
                return existing
            created = Session(0, _utf8(self.path, name, "session name"), slot, self._clock())
            row_id = self._insert("sessions", rows.record_row(created))
        return self._remember(replace(created, id=row_id))

    def get_session(self, name: str) -> Session:
        with self._reading():
            found = self._find_session(name)
        if found is None:
            raise UnknownSessionError(self.path, f"no session {name!r}")
        return found

    def sessions(self) -> list[Session]:
        with self._reading():
            found = self._select(f"{rows.SESSION_SELECT} ORDER BY s.id")
        return [self._remember(rows.session_from_row(row)) for row in found]

    def _find_session(self, name: str) -> Session | None:
        if name in self._sessions:
            return self._sessions[name]
        row = self._select_one(f"{rows.SESSION_SELECT} WHERE s.name = ?", (name,))
        return None if row is None else self._remember(rows.session_from_row(row))

    def _remember(self, session: Session) -> Session:
        # Sessions are never updated, so a cached row cannot go stale.
        self._sessions[session.name] = session
        return session

    # -- epochs ---------------------------------------------------------------------------------

    def start_epoch(
        self,
        session: str,
        *,
        reason: str,
        tools_text: str,
        system_text: str,
        carry_over: bool = False,
    ) -> Epoch:
        """Open a new epoch with fixed tools bytes and system text.

        With ``carry_over`` the conversation of the previous epoch (its user, assistant and tool
        entries) is copied, text for text, into the new one; otherwise the epoch starts empty
        (after a compaction the caller appends the summary).
        """
        _check_tools(self.path, tools_text)
        system = replay.system_message(_utf8(self.path, system_text, "system text"))
        with self.transaction():
            target = self.get_session(session)
            previous = self._current_epoch(target)
            number = 1 if previous is None else previous.number + 1
            epoch = Epoch(
                id=0,
                session_id=target.id,
                number=number,
                reason=reason,
                tools_text=tools_text,
                tools_sha256=chain.sha256_text(tools_text),
                system_text=system_text,
                created_at=self._clock(),
            )
            epoch_id = self._insert("epochs", rows.record_row(epoch))
            epoch = replace(epoch, id=epoch_id)
            self._append_entry(
                target,
                epoch,
                EntryKind.EPOCH,
                message=system,
                reason=_utf8(self.path, reason, "reason"),
                tools_sha256=epoch.tools_sha256,
            )
            if carry_over and previous is not None:
                self._carry_over(target, previous, epoch)
        return epoch

    def current_epoch(self, session: str) -> Epoch:
        with self._reading():
            target = self.get_session(session)
            epoch = self._current_epoch(target)
        if epoch is None:
            raise NoEpochError(self.path, f"session {session!r} has no epoch yet")
        return epoch

    def epochs(self, session: str) -> list[Epoch]:
        with self._reading():
            target = self.get_session(session)
            found = self._select(
                f"{rows.EPOCH_SELECT} WHERE ep.session_id = ? ORDER BY ep.number", (target.id,)
            )
        return [rows.epoch_from_row(row) for row in found]

    def _current_epoch(self, session: Session) -> Epoch | None:
        row = self._select_one(
            f"{rows.EPOCH_SELECT} WHERE ep.session_id = ? ORDER BY ep.number DESC LIMIT 1",
            (session.id,),
        )
        return None if row is None else rows.epoch_from_row(row)

    def _require_epoch(self, session: Session) -> Epoch:
        epoch = self._current_epoch(session)
        if epoch is None:
            raise NoEpochError(self.path, f"session {session.name!r} has no epoch; start one first")
        return epoch

    def _carry_over(self, session: Session, previous: Epoch, epoch: Epoch) -> None:
        found = self._select(
            f"{rows.ENTRY_SELECT} WHERE e.epoch_id = ? AND e.kind IN ('user', 'assistant', 'tool')"
            " ORDER BY e.seq",
            (previous.id,),
        )
        self._copy(session, epoch, [rows.entry_from_row(row) for row in found])

    def _copy(self, session: Session, epoch: Epoch, entries: Sequence[Entry]) -> list[Entry]:
        return [
            self._append_entry(
                session,
                epoch,
                old.kind,
                message=old.message,
                tool_call_id=old.fields.tool_call_id,
                request_id=old.fields.request_id,
                refers_to=old.seq,
            )
            for old in entries
        ]

    def copy_entries(self, session: str, entries: Sequence[Entry]) -> list[Entry]:
        """Copy user, assistant and tool entries of ``session``, text for text and in order,
        into its current epoch (each copy ``refers_to`` its original): a compaction carries the
        tool rounds of the turn under way, so the model sees the calls it made and their
        results instead of making them again."""
        if any(e.kind not in _COPIED_KINDS for e in entries):
            raise InvalidAppendError(self.path, "only user, assistant and tool entries are copied")
        with self.transaction():
            target = self.get_session(session)
            if any(e.session_id != target.id for e in entries):
                raise InvalidAppendError(self.path, f"an entry to copy is not of {session!r}")
            return self._copy(target, self._require_epoch(target), entries)

    # -- appends --------------------------------------------------------------------------------

    def append_user(self, session: str, text: str, *, external_key: str) -> Appended:
        """Append a user message once per ``external_key`` (a post id, or a fresh key)."""
        message = replay.user_message(_utf8(self.path, text, "user message"))
        _utf8(self.path, external_key, "external key")
        with self.transaction():
            target = self.get_session(session)
            row = self._select_one(
                f"{rows.ENTRY_SELECT} WHERE e.session_id = ? AND e.external_key = ?",
                (target.id, external_key),
            )
            if row is not None:
                return Appended(rows.entry_from_row(row), is_new=False)
            epoch = self._require_epoch(target)
            entry = self._append_entry(
                target, epoch, EntryKind.USER, message=message, external_key=external_key
            )
        return Appended(entry, is_new=True)

    def append_assistant(self, session: str, message_text: str, *, request: RequestRecord) -> Entry:
        """Append the assistant message exactly as assembled, with the request that produced it."""
        _utf8(self.path, message_text, "assistant message")
        try:
            tool_calls_of(message_text)
        except MalformedAssistantError as exc:
            raise InvalidMessageError(self.path, f"assistant message refused: {exc}") from exc
        with self.transaction():
            target = self.get_session(session)
            epoch = self._require_epoch(target)
            request_id = self._insert_request(target, request)
            return self._append_entry(
                target, epoch, EntryKind.ASSISTANT, message=message_text, request_id=request_id
            )

    def append_tool_result(self, session: str, *, tool_call_id: str, content: str) -> Entry:
        """Append the result of an unanswered tool call of the latest assistant message."""
        message = replay.tool_message(tool_call_id, _utf8(self.path, content, "tool result"))
        with self.transaction():
            target = self.get_session(session)
            epoch = self._require_epoch(target)
            open_calls = unanswered_calls(self._epoch_tail(epoch))
            if tool_call_id not in {call.call_id for call in open_calls}:
                raise ToolCallError(
                    self.path,
                    f"session {session!r}: no unanswered tool call {tool_call_id!r} "
                    f"(unanswered: {[call.call_id for call in open_calls]})",
                )
            return self._append_entry(
                target, epoch, EntryKind.TOOL, message=message, tool_call_id=tool_call_id
            )

    def append_broken(
        self,
        session: str,
        *,
        partial_text: str,
        reason: str,
        request: RequestRecord | None = None,
    ) -> Entry:
        """Record a stream that did not finish. It is kept for diagnosis and never replayed."""
        with self.transaction():
            target = self.get_session(session)
            epoch = self._require_epoch(target)
            request_id = None if request is None else self._insert_request(target, request)
            return self._append_entry(
                target,
                epoch,
                EntryKind.BROKEN,
                text=_utf8(self.path, partial_text, "partial text"),
                reason=_utf8(self.path, reason, "reason"),
                request_id=request_id,
            )

    def append_note(
        self,
        session: str,
        text: str,
        *,
        refers_to: int | None = None,
        reason: NoteReason | None = None,
    ) -> Entry:
        """A note or a correction of entry ``refers_to`` (a seq); never replayed. A ``reason``
        makes it count in the derivations (``NoteReason``): a take-back must refer to an entry
        of the current epoch."""
        if reason is NoteReason.TAKEN_BACK and refers_to is None:
            raise InvalidAppendError(self.path, "a take-back must name the entry it takes back")
        with self.transaction():
            target = self.get_session(session)
            epoch = self._require_epoch(target)
            if refers_to is not None and not self._entry_exists(target, refers_to):
                raise InvalidAppendError(
                    self.path, f"session {session!r} has no entry {refers_to} to refer to"
                )
            if (
                reason is NoteReason.TAKEN_BACK
                and refers_to is not None
                and not self._entry_exists(target, refers_to, epoch_id=epoch.id)
            ):
                raise InvalidAppendError(
                    self.path, f"entry {refers_to} of {session!r} is not in its current epoch"
                )
            return self._append_entry(
                target,
                epoch,
                EntryKind.NOTE,
                text=_utf8(self.path, text, "note"),
                reason=None if reason is None else reason.value,
                refers_to=refers_to,
            )

    def _entry_exists(self, session: Session, seq: int, *, epoch_id: int | None = None) -> bool:
        row = self._conn.execute(
            "SELECT 1 FROM entries WHERE session_id = ? AND seq = ?"
            " AND (? IS NULL OR epoch_id = ?)",
            (session.id, seq, epoch_id, epoch_id),
        ).fetchone()
        return row is not None

    def _append_entry(
        self,
        session: Session,
        epoch: Epoch,
        kind: EntryKind,
        *,
        message: str | None = None,
        text: str | None = None,
        reason: str | None = None,
        external_key: str | None = None,
        tool_call_id: str | None = None,
        request_id: int | None = None,
        refers_to: int | None = None,
        tools_sha256: str | None = None,
    ) -> Entry:
        head = self._select_one(
            "SELECT seq, hash FROM entries WHERE session_id = ? ORDER BY seq DESC LIMIT 1",
            (session.id,),
        )
        seq, prev_hash = (1, chain.genesis_hash(session.name, session.slot))
        if head is not None:
            seq, prev_hash = head["seq"] + 1, head["hash"]
        fields = EntryFields(
            seq=seq,
            epoch_number=epoch.number,
            kind=kind,
            message=message,
            text=text,
            reason=reason,
            external_key=external_key,
            tool_call_id=tool_call_id,
            request_id=request_id,
            refers_to=refers_to,
            tools_sha256=tools_sha256,
            created_at=self._clock(),
        )
        entry_hash = chain.entry_hash(prev_hash, fields)
        row_id = self._insert(
            "entries",
            rows.entry_row(session.id, epoch.id, fields, prev_hash, entry_hash),
        )
        return Entry(row_id, session.id, fields, prev_hash, entry_hash)

    # -- requests -------------------------------------------------------------------------------

    def record_request(self, session: str, request: RequestRecord) -> Request:
        """Record a request that produced no entry (a self-test, a prewarm, a failed request)."""
        with self.transaction():
            target = self.get_session(session)
            request_id = self._insert_request(target, request)
            created_at = self._conn.execute(
                "SELECT created_at FROM requests WHERE id = ?", (request_id,)
            ).fetchone()[0]
        return Request(request_id, target.id, request, created_at)

    def requests(self, session: str) -> list[Request]:
        with self._reading():
            target = self.get_session(session)
            found = self._select(
                f"{rows.REQUEST_SELECT} WHERE r.session_id = ? ORDER BY r.id", (target.id,)
            )
        return [rows.request_from_row(row) for row in found]

    def requests_after(self, row: int, limit: int) -> list[tuple[str, Request]]:
        """The first ``limit`` requests recorded after row ``row``, every session's, in order,
        each with its session's name: what was recorded since a reader last looked, by index."""
        with self._reading():
            found = self._select(
                f"{rows.REQUEST_SELECT} WHERE r.id > ? ORDER BY r.id LIMIT ?", (row, limit)
            )
            names = {s.id: s.name for s in self.sessions()} if found else {}
        return [(names[row["session_id"]], rows.request_from_row(row)) for row in found]

    def latest_request(
        self,
        session: str,
        *,
        epoch: int | None = None,
        kinds: Collection[RequestKind] = SESSION_KINDS,
        counted: bool = False,
        first: bool = False,
    ) -> Request | None:
        """The session's last request (``first``: its first) of one of ``kinds``, in ``epoch``
        (its number) if given, and with the server's counts (``cache_n``, ``prompt_n``, not both
        0 for a request that did not complete) if ``counted``; one indexed row, however many
        requests the session made."""
        where = ["r.session_id = ?", f"r.kind IN ({', '.join('?' * len(kinds))})"]
        params: list[Any] = []
        with self._reading():
            target = self.get_session(session)
            params = [target.id, *sorted(RequestKind(kind).value for kind in kinds)]
            if epoch is not None:
                where.append(
                    "r.epoch_id = (SELECT id FROM epochs WHERE session_id = ? AND number = ?)"
                )
                params += [target.id, epoch]
            if counted:  # a request that broke before the server counted a token left the slot
                where.append(
                    "r.cache_n IS NOT NULL AND r.prompt_n IS NOT NULL"
                    " AND (r.outcome = 'complete' OR r.cache_n + r.prompt_n > 0)"
                )
            order = "ASC" if first else "DESC"
            row = self._select_one(
                f"{rows.REQUEST_SELECT} WHERE {' AND '.join(where)} ORDER BY r.id {order} LIMIT 1",
                tuple(params),
            )
        return None if row is None else rows.request_from_row(row)

    def taken_back_since(self, session: str, recorded_at: str) -> bool:
        """Whether an entry of the session was taken back (``NoteReason.TAKEN_BACK``) after the
        moment ``recorded_at`` (a request's ``created_at``)."""
        with self._reading():
            target = self.get_session(session)
            row = self._conn.execute(
                "SELECT 1 FROM entries WHERE session_id = ? AND kind = 'note' AND reason = ?"
                " AND created_at > ? LIMIT 1",
                (target.id, NoteReason.TAKEN_BACK.value, recorded_at),
            ).fetchone()
        return row is not None

    def slot_used_since(
        self, slot: int | None, request_row: int, *, besides: str, endpoint: str | None = None
    ) -> bool:
        """Whether a request of a session other than ``besides`` ran on ``slot`` (None: on any
        slot) of ``endpoint``'s server (None: the shorthand's, whose requests name none) after
        the request in row ``request_row`` (the slot then held another prompt for a while).
        Another server's slot of the same number is another slot."""
        with self._reading():
            target = self.get_session(besides)
            row = self._conn.execute(
                "SELECT 1 FROM requests WHERE (? IS NULL OR slot = ?) AND id > ? "
                "AND session_id != ? AND json_extract(extra, '$.endpoint') IS ? LIMIT 1",
                (slot, slot, request_row, target.id, endpoint),
            ).fetchone()
        return row is not None

    def _insert_request(self, session: Session, request: RequestRecord) -> int:
        epoch = self._select_one(
            "SELECT id FROM epochs WHERE session_id = ? AND number = ?",
            (session.id, request.epoch),
        )
        if epoch is None:
            raise NoEpochError(self.path, f"session {session.name!r} has no epoch {request.epoch}")
        try:
            row = rows.request_row(session.id, epoch["id"], request, self._clock())
        except (TypeError, ValueError) as exc:
            raise InvalidAppendError(self.path, f"request extra is not JSON: {exc}") from exc
        return self._insert("requests", row)

    # -- reading --------------------------------------------------------------------------------

    def replay_messages(self, session: str) -> list[str]:
        """The current epoch's messages, as stored: the system message first, then in log order,
        less the answers taken back since (``NoteReason.TAKEN_BACK``)."""
        with self._reading():
            epoch = self._require_epoch(self.get_session(session))
            # Inside an open transaction rows may still be rolled back: read, but do not keep.
            keep = session in self._holds and not self._conn.in_transaction
            held = self._replayed.get(session) if keep else None
            last_seq, known = (held[1], held[2]) if held and held[0] == epoch.id else (-1, [])
            found = self._conn.execute(
                "SELECT seq, message, refers_to FROM entries WHERE epoch_id = ? AND seq > ?"
                " AND (message IS NOT NULL OR (kind = 'note' AND reason = ?)) ORDER BY seq",
                (epoch.id, last_seq, NoteReason.TAKEN_BACK.value),
            ).fetchall()
            # Plain tuples on this path: a request build reads it, and it names its columns.
            for seq, message, refers_to in found:
                if message is not None:
                    known.append((seq, message))
                else:  # a take-back: the entry it names is no longer replayed
                    known = [(s, m) for s, m in known if s != refers_to]
            if keep:
                self._replayed[session] = (epoch.id, found[-1][0] if found else last_seq, known)
            return [message for _, message in known]

    @contextmanager
    def holding_replay(self, session: str) -> Iterator[None]:
        """Keep the session's replayed messages between requests while this lasts (a turn), so
        that each build reads only what was appended since; dropped at the end. Nestable."""
        with self._lock:
            self._holds[session] = self._holds.get(session, 0) + 1
        try:
            yield
        finally:
            with self._lock:
                self._holds[session] -= 1
                if not self._holds[session]:
                    del self._holds[session]
                    self._replayed.pop(session, None)

    def entries(self, session: str, *, after_seq: int = 0, limit: int | None = None) -> list[Entry]:
        """The session's entries after ``after_seq`` (all of them by default), in log order;
        the first ``limit`` of them when given."""
        with self._reading():
            target = self.get_session(session)
            found = self._select(
                f"{rows.ENTRY_SELECT} WHERE e.session_id = ? AND e.seq > ? ORDER BY e.seq LIMIT ?",
                (target.id, after_seq, -1 if limit is None else limit),
            )
        return [rows.entry_from_row(row) for row in found]

    def latest_entries(
        self, session: str, count: int, *, before_seq: int | None = None
    ) -> list[Entry]:
        """The session's last ``count`` entries (before ``before_seq``), in log order: a read
        of what is recent, by index, however long the session is."""
        with self._reading():
            target = self.get_session(session)
            found = self._select(
                f"{rows.ENTRY_SELECT} WHERE e.session_id = ? AND e.seq < ?"
                " ORDER BY e.seq DESC LIMIT ?",
                (target.id, (1 << 62) if before_seq is None else before_seq, count),
            )
        return [rows.entry_from_row(row) for row in reversed(found)]

    def epoch_entries(self, session: str, epoch: int) -> list[Entry]:
        """The entries of the session's epoch ``epoch`` (its number), in log order."""
        with self._reading():
            target = self.get_session(session)
            found = self._select(
                f"{rows.ENTRY_SELECT} WHERE e.epoch_id = (SELECT id FROM epochs"
                " WHERE session_id = ? AND number = ?) ORDER BY e.seq",
                (target.id, epoch),
            )
        return [rows.entry_from_row(row) for row in found]

    def state(self, session: str) -> SessionState:
        """What the session waits for (pending turn, interrupted tool calls), from its rows."""
        with self._reading():
            target = self.get_session(session)
            epoch = self._current_epoch(target)
            tail = [] if epoch is None else self._epoch_tail(epoch)
        return derive_state(session, tail)

    def last_answered(self) -> dict[str, int]:
        """Each session with an answer, and the id of its latest assistant entry (entry ids grow
        with time, so the highest id is the most recently active session)."""
        with self._reading():
            # One indexed row per session (its entries' ids grow with their seq).
            found = self._conn.execute(
                "SELECT s.name, (SELECT e.id FROM entries e WHERE e.session_id = s.id"
                " AND e.kind = 'assistant' ORDER BY e.seq DESC LIMIT 1) AS last_id"
                " FROM sessions s"
            ).fetchall()
        return {name: last_id for name, last_id in found if last_id is not None}

    def last_endpoints(self) -> dict[str, tuple[str, str]]:
        """Each session that sent a request naming its endpoint (``extra["endpoint"]``, where
        loopd runs several servers), with the endpoint of its latest such request and when that
        request was recorded: where its cache is."""
        with self._reading():
            found = self._conn.execute(
                "SELECT s.name, json_extract(r.extra, '$.endpoint'), r.created_at"
                " FROM requests r JOIN sessions s ON s.id = r.session_id"
                " WHERE r.id IN (SELECT max(id) FROM requests"
                "  WHERE json_type(extra, '$.endpoint') = 'text' GROUP BY session_id)"
            ).fetchall()
        return {name: (endpoint, created_at) for name, endpoint, created_at in found}

    def endpoint_slots(self) -> dict[tuple[str, str], int]:
        """(session, endpoint) -> the slot of the session's latest request on that endpoint,
        for each request naming its endpoint: the slot the session keeps there."""
        with self._reading():
            found = self._conn.execute(
                "SELECT s.name, json_extract(r.extra, '$.endpoint'), r.slot"
                " FROM requests r JOIN sessions s ON s.id = r.session_id"
                " WHERE r.id IN (SELECT max(id) FROM requests"
                "  WHERE json_type(extra, '$.endpoint') = 'text'"
                "  GROUP BY session_id, json_extract(extra, '$.endpoint'))"
            ).fetchall()
        return {(name, endpoint): slot for name, endpoint, slot in found}

    def pending_states(self) -> list[SessionState]:
        """The state of every session, for a restart."""
        with self._reading():
            return [self.state(session.name) for session in self.sessions()]

    def _epoch_tail(self, epoch: Epoch) -> list[Entry]:
        """The epoch's entries from its latest assistant entry on (all of them if none): two
        indexed reads, of one row and of the tail."""
        (since,) = self._conn.execute(
            "SELECT coalesce(max(seq), 0) FROM entries WHERE epoch_id = ? AND kind = 'assistant'",
            (epoch.id,),
        ).fetchone()
        found = self._select(
            f"{rows.ENTRY_SELECT} WHERE e.epoch_id = ? AND e.seq >= ? ORDER BY e.seq",
            (epoch.id, since),
        )
        return [rows.entry_from_row(row) for row in found]

    def trace(self, callback: Callable[[str], None] | None) -> None:
        """Pass each statement the log runs, its values filled in, to ``callback`` (None:
        stop): how the query-plan test finds every query of a request's path."""
        with self._lock:
            self._conn.set_trace_callback(callback)

    def integrity_problems(self) -> list[str]:
        """SQLite's full integrity check; empty when the file is sound."""
        with self._reading():
            found = self._conn.execute("PRAGMA integrity_check").fetchall()
        return [row[0] for row in found if row[0] != "ok"]

    def trigger_names(self) -> set[str]:
        with self._reading():
            found = self._conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")
            return {row[0] for row in found}


def _check_file(path: Path, conn: sqlite3.Connection) -> None:
    """Refuse a file that is not a session log, one a newer loopd wrote, or a damaged one."""
    # The first read of the file: it fails here on a file that is not SQLite.
    application_id = int(conn.execute("PRAGMA application_id").fetchone()[0])
    if application_id != APPLICATION_ID:
        tables = [
            name
            for (name,) in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite%'"
            )
        ]
        if tables:
            raise NotALogError(path, f"an SQLite database but not a session log (tables: {tables})")
        if application_id:
            raise NotALogError(path, "an SQLite database of another application")
    try:
        MIGRATIONS.pending(conn)
    except NewerSchemaError as exc:
        raise SchemaTooNewError(
            path,
            f"{exc.schema} was written by a newer loopd "
            f"(this one understands up to {exc.known}); upgrade loopd to read it",
        ) from exc
    problems = [row[0] for row in conn.execute("PRAGMA quick_check").fetchall()]
    if problems != ["ok"]:
        raise CorruptLogError(path, "damaged database: " + "; ".join(problems[:3]))


def translate_error(path: Path, exc: sqlite3.Error) -> LogError:
    """The owned error for an SQLite failure on ``path``."""
    name = getattr(exc, "sqlite_errorname", "") or type(exc).__name__
    if name == "SQLITE_FULL":
        return DiskFullError(path, "disk full (SQLITE_FULL); the write was rolled back")
    if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
        return LockedError(path, f"database is locked by another process ({name})")
    if name == "SQLITE_NOTADB":
        return NotALogError(path, "not an SQLite database (a foreign or encrypted file)")
    if name.startswith("SQLITE_CORRUPT"):
        return CorruptLogError(path, f"damaged database ({exc})")
    if name == "SQLITE_CONSTRAINT_TRIGGER" and "append-only" in str(exc):
        return AppendOnlyError(path, str(exc))
    if name.startswith("SQLITE_CANTOPEN"):
        return StorageError(path, f"cannot open the file ({exc})")
    return StorageError(path, f"{name}: {exc}")


def _utf8(path: Path, text: str, what: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidMessageError(path, f"{what} is not valid UTF-8 text ({exc.reason})") from exc
    return text


def _check_tools(path: Path, tools_text: str) -> None:
    _utf8(path, tools_text, "tools")
    try:
        tools = json.loads(tools_text)
    except json.JSONDecodeError as exc:
        raise InvalidMessageError(path, f"tools text is not JSON ({exc})") from exc
    if not isinstance(tools, list):
        raise InvalidMessageError(path, "tools text is not a JSON array")
