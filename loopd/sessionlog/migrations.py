"""Versioned schema of the session log, by ``loopcommon.migrations``.

The file is marked as a session log by ``PRAGMA application_id``, set by the first step. Every
table is append-only: triggers refuse UPDATE and DELETE (those of the ``_migrations`` record are
the mechanism's own), and corrections are entries.
"""

import sqlite3

from loopcommon.migrations import Migrations, append_only_triggers, execute_script

APPLICATION_ID = 0x6C6F6F70  # "loop"

APPEND_ONLY_TABLES = ("sessions", "epochs", "entries", "requests")

_V1_TABLES = """
CREATE TABLE sessions (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    slot INTEGER NOT NULL CHECK (slot >= 0),
    created_at TEXT NOT NULL
) STRICT;

CREATE TABLE epochs (
    id INTEGER PRIMARY KEY,
    session_id INTEGER NOT NULL REFERENCES sessions (id),
    number INTEGER NOT NULL CHECK (number >= 1),
    reason TEXT NOT NULL,
    tools_text TEXT NOT NULL,
    tools_sha256 TEXT NOT NULL,
    system_text TEXT NOT NULL,
    created_at TEXT NOT NULL,
    UNIQUE (session_id, number)
) STRICT;

CREATE TABLE requests (
    id INTEGER PRIMARY KEY,
    session_id INTEGER NOT NULL REFERENCES sessions (id),
    epoch_id INTEGER NOT NULL REFERENCES epochs (id),
    kind TEXT NOT NULL
        CHECK (kind IN ('turn', 'tool_followup', 'selftest', 'compaction', 'prewarm')),
    slot INTEGER NOT NULL,
    message_count INTEGER NOT NULL CHECK (message_count >= 0),
    messages_sha256 TEXT NOT NULL,
    outcome TEXT NOT NULL,
    cache_n INTEGER,
    prompt_n INTEGER,
    predicted_n INTEGER,
    ttfb_ms REAL,
    queue_wait_ms REAL,
    prompt_per_second REAL,
    predicted_per_second REAL,
    thinking_tokens INTEGER,
    capped INTEGER NOT NULL CHECK (capped IN (0, 1)),
    cache_loss INTEGER,
    cache_loss_cause TEXT,
    extra TEXT NOT NULL CHECK (json_valid(extra)),
    created_at TEXT NOT NULL
) STRICT;

CREATE INDEX requests_by_session ON requests (session_id, id);

CREATE TABLE entries (
    id INTEGER PRIMARY KEY,
    session_id INTEGER NOT NULL REFERENCES sessions (id),
    seq INTEGER NOT NULL CHECK (seq >= 1),
    epoch_id INTEGER NOT NULL REFERENCES epochs (id),
    kind TEXT NOT NULL
        CHECK (kind IN ('epoch', 'user', 'assistant', 'tool', 'broken', 'note')),
    message TEXT,
    text TEXT,
    reason TEXT,
    external_key TEXT,
    tool_call_id TEXT,
    request_id INTEGER REFERENCES requests (id),
    refers_to INTEGER,
    tools_sha256 TEXT,
    created_at TEXT NOT NULL,
    prev_hash TEXT NOT NULL,
    hash TEXT NOT NULL,
    UNIQUE (session_id, seq),
    UNIQUE (session_id, external_key),
    CHECK ((message IS NOT NULL) = (kind IN ('epoch', 'user', 'assistant', 'tool')))
) STRICT;

-- The replay query reads one epoch's messages in log order from this index alone.
CREATE INDEX entries_replay ON entries (epoch_id, seq) WHERE message IS NOT NULL;
CREATE INDEX entries_by_kind ON entries (session_id, kind, seq);
"""


MIGRATIONS = Migrations()


@MIGRATIONS.step
def m001_initial(db: sqlite3.Connection) -> None:
    """The schema of loopd 0.1.0 (``user_version`` 1 before the ``_migrations`` table)."""
    execute_script(db, _V1_TABLES + append_only_triggers(*APPEND_ONLY_TABLES))
    db.execute(f"PRAGMA application_id = {APPLICATION_ID}")


_V2_INDEXES = """
-- A session's state (its epoch's rows from the latest assistant entry on) and a compaction's
-- read of its epoch: an indexed range of the epoch's rows, whatever else the file holds.
CREATE INDEX IF NOT EXISTS entries_by_epoch ON entries (epoch_id, seq);
CREATE INDEX IF NOT EXISTS entries_by_epoch_kind ON entries (epoch_id, kind, seq);
-- The first and the last request of an epoch (the cache-loss rule, the prompt's known size).
CREATE INDEX IF NOT EXISTS requests_by_epoch ON requests (epoch_id, id);
"""


@MIGRATIONS.step
def m002_epoch_indexes(db: sqlite3.Connection) -> None:
    """Indexes for the per-request reads, so that a request costs what is new, not the file."""
    execute_script(db, _V2_INDEXES)


def expected_triggers() -> frozenset[str]:
    return frozenset(f"{t}_no_{op}" for t in APPEND_ONLY_TABLES for op in ("update", "delete"))
