"""The session log's rows, by column name: the one mapping between the tables and ``records``.

Each record's fields are written out once, in its dataclass in ``records``. The column lists here
are derived from them, and a row travels both ways as a mapping of column name to value (``Row``):
written through named parameters, read with each value named by its column
(``SessionLog._select``). Nothing depends on the order of columns.
"""

import json
from collections.abc import Iterable, Mapping
from dataclasses import fields
from functools import cache
from typing import Any

from loopcommon import jsonbytes
from loopd.sessionlog.records import (
    ENTRY_FIELDS,
    Entry,
    EntryFields,
    EntryKind,
    Epoch,
    Perf,
    Request,
    RequestKind,
    RequestRecord,
    Session,
)

Row = Mapping[str, Any]


def _names(record_type: Any) -> tuple[str, ...]:
    return tuple(f.name for f in fields(record_type))


def _columns(names: Iterable[str], table: str) -> str:
    return ", ".join(f"{table}.{name}" for name in names)


SESSION_COLUMNS = _names(Session)
EPOCH_COLUMNS = _names(Epoch)
PERF_COLUMNS = _names(Perf)
# Stored as the row's epoch id; an entry says (and its hash covers) the epoch's number.
_ENTRY_STORED = tuple(name for name in ENTRY_FIELDS if name != "epoch_number")
_REQUEST_STORED = tuple(name for name in _names(RequestRecord) if name not in ("epoch", "perf"))

SESSION_SELECT = f"SELECT {_columns(SESSION_COLUMNS, 's')} FROM sessions s"
EPOCH_SELECT = f"SELECT {_columns(EPOCH_COLUMNS, 'ep')} FROM epochs ep"
ENTRY_SELECT = (
    f"SELECT e.id, e.session_id, {_columns(_ENTRY_STORED, 'e')}, ep.number AS epoch_number,"
    " e.prev_hash, e.hash FROM entries e JOIN epochs ep ON ep.id = e.epoch_id"
)
REQUEST_SELECT = (
    f"SELECT r.id, r.session_id, {_columns(_REQUEST_STORED + PERF_COLUMNS, 'r')},"
    " ep.number AS epoch, r.created_at FROM requests r JOIN epochs ep ON ep.id = r.epoch_id"
)

# ``EntryKind(value)`` costs about 1.5 µs a row, this lookup a few dozen ns: about an eighth of
# the time to read a session's entries (``loopd log show``, ``verify``).
_ENTRY_KINDS = {kind.value: kind for kind in EntryKind}


@cache
def insert_sql(table: str, columns: tuple[str, ...]) -> str:
    names = ", ".join(columns)
    return f"INSERT INTO {table} ({names}) VALUES ({', '.join(':' + c for c in columns)})"


def record_row(record: Session | Epoch) -> dict[str, Any]:
    """A session's or an epoch's columns by name, but its id: SQLite gives the row its id."""
    return {name: getattr(record, name) for name in _names(type(record)) if name != "id"}


def entry_row(
    session_id: int, epoch_id: int, entry: EntryFields, prev_hash: str, entry_hash: str
) -> dict[str, Any]:
    row: dict[str, Any] = {"session_id": session_id, "epoch_id": epoch_id}
    row.update((name, getattr(entry, name)) for name in _ENTRY_STORED)
    row["kind"] = entry.kind.value
    row.update(prev_hash=prev_hash, hash=entry_hash)
    return row


def request_row(
    session_id: int, epoch_id: int, record: RequestRecord, created_at: str
) -> dict[str, Any]:
    """The request's columns; raises ``TypeError`` or ``ValueError`` for an ``extra`` that is
    not JSON."""
    row: dict[str, Any] = {"session_id": session_id, "epoch_id": epoch_id}
    row.update((name, getattr(record, name)) for name in _REQUEST_STORED)
    row["kind"] = RequestKind(record.kind).value
    row.update((name, getattr(record.perf, name)) for name in PERF_COLUMNS)
    row["capped"] = int(record.perf.capped)
    row["extra"] = jsonbytes.dumps(dict(record.perf.extra))
    row["created_at"] = created_at
    return row


def session_from_row(row: Row) -> Session:
    return Session(**_pick(row, SESSION_COLUMNS))


def epoch_from_row(row: Row) -> Epoch:
    return Epoch(**_pick(row, EPOCH_COLUMNS))


def entry_from_row(row: Row) -> Entry:
    values = _pick(row, ENTRY_FIELDS)
    values["kind"] = _ENTRY_KINDS[values["kind"]]
    return Entry(
        id=row["id"],
        session_id=row["session_id"],
        fields=EntryFields(**values),
        prev_hash=row["prev_hash"],
        hash=row["hash"],
    )


def request_from_row(row: Row) -> Request:
    perf = _pick(row, PERF_COLUMNS)
    perf["capped"] = bool(perf["capped"])
    perf["extra"] = json.loads(perf["extra"])
    record = _pick(row, _REQUEST_STORED)
    record["kind"] = RequestKind(record["kind"])
    return Request(
        id=row["id"],
        session_id=row["session_id"],
        record=RequestRecord(**record, epoch=row["epoch"], perf=Perf(**perf)),
        created_at=row["created_at"],
    )


def _pick(row: Row, names: Iterable[str]) -> dict[str, Any]:
    return {name: row[name] for name in names}
