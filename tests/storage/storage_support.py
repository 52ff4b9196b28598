"""Helpers for the tests of the SQLite files loopd and brokerd own, and their upgrades."""

import shutil
import sqlite3
from pathlib import Path

# Written by loopd 0.1.0: see tests/data/db/write_fixtures.py.
FIXTURES = Path(__file__).parents[1] / "data" / "db"


def copied_fixture(name: str, folder: Path) -> Path:
    """A copy of fixture ``name`` in ``folder``: opening a file may migrate it."""
    path = folder / name
    shutil.copyfile(FIXTURES / name, path)
    return path


def query(path: Path, sql: str) -> list[tuple[object, ...]]:
    """The rows of ``sql``, read through a connection of its own."""
    conn = sqlite3.connect(path)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def schema(path: Path) -> list[tuple[object, ...]]:
    """The kind and name of every table, index, view and trigger."""
    return query(path, "SELECT type, name FROM sqlite_master ORDER BY type, name")


def add_migration_record(path: Path, name: str) -> None:
    """Record a migration this program does not know, as a newer program would."""
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("INSERT INTO _migrations (name) VALUES (?)", (name,))
    conn.close()
