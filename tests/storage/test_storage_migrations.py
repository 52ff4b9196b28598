"""The one migration mechanism every SQLite file of loopd and brokerd uses."""

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from loopcommon.migrations import (
    MigrationError,
    Migrations,
    NewerSchemaError,
    execute_script,
)


def m001_notes(db: sqlite3.Connection) -> None:
    db.execute("CREATE TABLE IF NOT EXISTS notes (id INTEGER PRIMARY KEY, text TEXT)")


def m002_tags(db: sqlite3.Connection) -> None:
    db.execute("CREATE TABLE tags (note_id INTEGER, tag TEXT)")


def m003_index(db: sqlite3.Connection) -> None:
    db.execute("CREATE INDEX tags_by_tag ON tags (tag)")


def _steps(count: int = 3) -> Migrations:
    """The migrations of a program that knows the first ``count`` steps."""
    migrations = Migrations()
    for step in (m001_notes, m002_tags, m003_index)[:count]:
        migrations.step(step)
    return migrations


@pytest.fixture
def db(tmp_path: Path) -> Iterator[sqlite3.Connection]:
    conn = sqlite3.connect(tmp_path / "file.db", isolation_level=None)
    yield conn
    conn.close()


def _recorded(db: sqlite3.Connection) -> list[str]:
    return [row[0] for row in db.execute("SELECT name FROM _migrations ORDER BY rowid")]


def _objects(db: sqlite3.Connection) -> set[str]:
    return {row[0] for row in db.execute("SELECT name FROM sqlite_master")}


def _version(db: sqlite3.Connection) -> int:
    return int(db.execute("PRAGMA user_version").fetchone()[0])


def test_a_new_file_gets_every_step_in_order_and_records_each(db: sqlite3.Connection) -> None:
    migrations = _steps()
    assert migrations.pending(db) == ["m001_notes", "m002_tags", "m003_index"]
    assert migrations.apply(db) == ["m001_notes", "m002_tags", "m003_index"]
    assert _recorded(db) == ["m001_notes", "m002_tags", "m003_index"]
    assert _version(db) == 3
    assert {"notes", "tags", "tags_by_tag"} <= _objects(db)
    assert migrations.pending(db) == []


def test_an_up_to_date_file_runs_nothing_and_takes_no_write_lock(
    db: sqlite3.Connection, tmp_path: Path
) -> None:
    _steps().apply(db)
    holder = sqlite3.connect(tmp_path / "file.db", isolation_level=None, timeout=0)
    holder.execute("BEGIN IMMEDIATE")  # a writer holds the lock; a reader must still open
    try:
        reader = sqlite3.connect(tmp_path / "file.db", isolation_level=None, timeout=0)
        assert _steps().apply(reader) == []
        reader.close()
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_only_the_missing_steps_run_on_an_older_file(db: sqlite3.Connection) -> None:
    _steps(1).apply(db)  # the file as a program that knew one step left it
    assert _steps().apply(db) == ["m002_tags", "m003_index"]
    assert _recorded(db) == ["m001_notes", "m002_tags", "m003_index"]


def test_a_failing_step_leaves_nothing_of_itself(db: sqlite3.Connection) -> None:
    migrations = _steps()

    @migrations.step
    def m004_broken(db: sqlite3.Connection) -> None:
        db.execute("CREATE TABLE half_done (x)")
        db.execute("INSERT INTO notes (text) VALUES ('written by the broken step')")
        db.execute("CREATE TABLE notes (x)")  # fails: notes exists

    with pytest.raises(sqlite3.OperationalError, match="already exists"):
        migrations.apply(db)
    assert "half_done" not in _objects(db)
    assert db.execute("SELECT count(*) FROM notes").fetchone()[0] == 0
    assert _recorded(db) == ["m001_notes", "m002_tags", "m003_index"]  # the steps before it stay
    assert _version(db) == 3
    assert not db.in_transaction


def test_a_step_that_commits_by_itself_is_refused(db: sqlite3.Connection) -> None:
    migrations = Migrations()

    @migrations.step
    def m001_script(db: sqlite3.Connection) -> None:
        db.executescript("CREATE TABLE t (x);")  # commits the step's transaction first

    with pytest.raises(MigrationError, match="m001_script ended its transaction"):
        migrations.apply(db)
    assert _recorded(db) == []  # never counted as done, so never mistaken for a whole step
    assert _version(db) == 0


def test_a_file_with_steps_this_program_does_not_know_is_refused(db: sqlite3.Connection) -> None:
    _steps().apply(db)
    with pytest.raises(NewerSchemaError, match=r"version 3 \(m003_index\) is newer .*up to 2"):
        _steps(2).pending(db)
    with pytest.raises(NewerSchemaError):
        _steps(2).apply(db)


def test_a_version_beyond_the_known_steps_is_refused(db: sqlite3.Connection) -> None:
    _steps().apply(db)
    db.execute("PRAGMA user_version = 9")
    with pytest.raises(NewerSchemaError, match="schema version 9 is newer"):
        _steps().apply(db)


def test_a_file_from_before_the_table_counts_its_version_as_steps_applied(
    db: sqlite3.Connection,
) -> None:
    # What the versioned files looked like before: the schema of step 1, user_version 1.
    db.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, text TEXT)")
    db.execute("INSERT INTO notes (text) VALUES ('kept')")
    db.execute("PRAGMA user_version = 1")
    assert _steps().apply(db) == ["m002_tags", "m003_index"]
    rows = db.execute("SELECT name, applied_at FROM _migrations ORDER BY rowid").fetchall()
    assert rows[0] == ("m001_notes", None)  # applied before there was a record of when
    assert [name for name, _ in rows] == ["m001_notes", "m002_tags", "m003_index"]
    assert db.execute("SELECT text FROM notes").fetchall() == [("kept",)]


def test_an_unversioned_file_gets_its_first_step_again_and_keeps_its_rows(
    db: sqlite3.Connection,
) -> None:
    db.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, text TEXT)")
    db.execute("INSERT INTO notes (text) VALUES ('kept')")
    assert _steps().apply(db) == ["m001_notes", "m002_tags", "m003_index"]
    assert db.execute("SELECT text FROM notes").fetchall() == [("kept",)]


def test_the_record_of_migrations_is_append_only(db: sqlite3.Connection) -> None:
    _steps().apply(db)
    for statement in ("DELETE FROM _migrations", "UPDATE _migrations SET name = 'x'"):
        with pytest.raises(sqlite3.IntegrityError, match="append-only"):
            db.execute(statement)


def test_steps_must_be_numbered_in_order() -> None:
    migrations = Migrations()

    def m002_first(db: sqlite3.Connection) -> None:
        del db

    def initial(db: sqlite3.Connection) -> None:
        del db

    with pytest.raises(ValueError, match="must be named m001_<what>"):
        migrations.step(m002_first)
    with pytest.raises(ValueError, match="must be named m001_<what>"):
        migrations.step(initial)


def test_a_script_runs_statement_by_statement_inside_the_transaction(
    db: sqlite3.Connection,
) -> None:
    db.execute("BEGIN IMMEDIATE")
    execute_script(
        db,
        """
        CREATE TABLE t (x TEXT); -- a comment; with a semicolon
        INSERT INTO t VALUES ('a;b');
        CREATE TRIGGER t_no_delete BEFORE DELETE ON t
        BEGIN SELECT RAISE(ABORT, 'no; never'); END;
        """,
    )
    assert db.in_transaction
    db.execute("ROLLBACK")
    assert _objects(db) == set()


def test_a_script_ending_mid_statement_is_refused(db: sqlite3.Connection) -> None:
    with pytest.raises(ValueError, match="incomplete SQL statement"):
        execute_script(
            db, "CREATE TABLE t (x); CREATE TRIGGER x BEFORE DELETE ON t BEGIN SELECT 1;"
        )
