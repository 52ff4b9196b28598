"""The session log: loopd's append-only source of truth, replayed byte for byte.

See ``store.SessionLog`` for the API, ``errors`` for the exception tree, ``replay`` for how a
request's messages are built, ``state`` for what a session waits for after a restart.
"""

from loopd.sessionlog.chain import messages_digest
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
from loopd.sessionlog.records import (
    Appended,
    Entry,
    EntryKind,
    Epoch,
    InterruptedCall,
    Perf,
    Request,
    RequestKind,
    RequestRecord,
    Session,
    SessionState,
    fresh_external_key,
)
from loopd.sessionlog.replay import messages_array
from loopd.sessionlog.store import SessionLog

__all__ = [
    "AppendOnlyError",
    "Appended",
    "CorruptLogError",
    "DiskFullError",
    "Entry",
    "EntryKind",
    "Epoch",
    "InterruptedCall",
    "InvalidAppendError",
    "InvalidMessageError",
    "LockedError",
    "LogError",
    "LogNotFoundError",
    "NoEpochError",
    "NotALogError",
    "Perf",
    "Request",
    "RequestKind",
    "RequestRecord",
    "SchemaTooNewError",
    "Session",
    "SessionLog",
    "SessionState",
    "SlotMismatchError",
    "StorageError",
    "ToolCallError",
    "UnknownSessionError",
    "fresh_external_key",
    "messages_array",
    "messages_digest",
]
