"""The session log: loopd's append-only source of truth, replayed byte for byte.

See ``store.SessionLog`` for the API, ``errors`` for the exception tree, ``replay`` for how a
request's messages are built, ``state`` for what a session waits for after a restart, ``rows`` for
how records map to rows and ``migrations`` for the schema.

The log uses the standard library's ``sqlite3`` directly, not sqlite-utils. Its schema is fixed
SQL with what sqlite-utils' table builder does not express (CHECK constraints, append-only
triggers, a partial index), applied by ``loopcommon.migrations``; every write is an
explicit ``BEGIN IMMEDIATE`` transaction whose rows are hashed before they are inserted; and
``Table.insert`` reads the schema twice per row, ready to create a missing table with columns
guessed from the row, which a log with a fixed schema never wants (27 µs an insert against 2 µs
through ``sqlite3``, measured on a scratch table). What else it would give here is small: a
table list is one query, and its script runner that stays inside a transaction is
``execute_script`` in ``loopcommon.migrations``, which the chat state and brokerd's audit log
use too.
"""

from loopd.sessionlog.chain import messages_digest
from loopd.sessionlog.errors import (
    AppendOnlyError,
    CorruptLogError,
    DiskFullError,
    InvalidMessageError,
    LockedError,
    LogNotFoundError,
    NoEpochError,
    NotALogError,
    SchemaTooNewError,
    SlotMismatchError,
    StorageError,
    ToolCallError,
    UnknownSessionError,
)
from loopd.sessionlog.records import (
    EntryKind,
    InterruptedCall,
    Perf,
    RequestKind,
    RequestRecord,
    fresh_external_key,
)
from loopd.sessionlog.replay import messages_array
from loopd.sessionlog.store import SessionLog

__all__ = [
    "AppendOnlyError",
    "CorruptLogError",
    "DiskFullError",
    "EntryKind",
    "InterruptedCall",
    "InvalidMessageError",
    "LockedError",
    "LogNotFoundError",
    "NoEpochError",
    "NotALogError",
    "Perf",
    "RequestKind",
    "RequestRecord",
    "SchemaTooNewError",
    "SessionLog",
    "SlotMismatchError",
    "StorageError",
    "ToolCallError",
    "UnknownSessionError",
    "fresh_external_key",
    "messages_array",
    "messages_digest",
]
