"""Searching the session log through the index beside it (``loopd.sessionlog.search``): what is
found and in which order, the index kept up to date, rebuilt when missing, damaged or behind a
replaced log, and the log never written to."""

from __future__ import annotations

import hashlib
import os
import sqlite3
from pathlib import Path

import pytest

from loopd.cli.main import main
from loopd.sessionlog import SessionLog, search
from loopd.sessionlog.errors import NotALogError
from loopd.sessionlog.records import fresh_external_key
from loopd.sessionlog.search import index_path, search_log
from loopd.sessionlog.searchtext import EmptyQueryError
from tests.sessionlog.sessionlog_support import (
    SYSTEM,
    TOOLS,
    assistant_text,
    open_started,
    request_for,
)
from tests.watch import run_watched


def _exchange(log: SessionLog, session: str, question: str, answer: str) -> None:
    log.append_user(session, question, external_key=fresh_external_key())
    log.append_assistant(session, assistant_text(answer), request=request_for(log, session))


def _two_sessions(db_path: Path) -> None:
    with open_started(db_path, "alpha") as log:
        _exchange(log, "alpha", "Where is the parser?", "The parser lives in wire/stream.py.")
        log.ensure_session("beta", 1)
        log.start_epoch("beta", reason="start", tools_text=TOOLS, system_text=SYSTEM)
        _exchange(log, "beta", "Does the PARSER stream?", "Yes, chunk by chunk.")


def _digest(db_path: Path) -> str:
    """The log's bytes: the file and its write-ahead log (the -shm file is SQLite's shared index
    of the WAL, which every reader marks)."""
    files = [db_path, db_path.with_name(db_path.name + "-wal")]
    return hashlib.sha256(b"".join(p.read_bytes() for p in files if p.exists())).hexdigest()


def test_hits_are_newest_first_across_sessions_case_insensitive(db_path: Path) -> None:
    _two_sessions(db_path)
    hits = search_log(db_path, ["parser"])
    assert [(h.session, h.seq, h.kind) for h in hits] == [
        ("beta", 2, "user"),
        ("alpha", 3, "assistant"),
        ("alpha", 2, "user"),
    ]
    assert hits[0].context == "Does the PARSER stream?"
    assert [h.session for h in search_log(db_path, ["parser", "stream"])] == ["beta", "alpha"]
    assert search_log(db_path, ["parser"], session="alpha")[0].seq == 3
    assert len(search_log(db_path, ["parser"], limit=1)) == 1
    assert search_log(db_path, ["nowhere"]) == []
    with pytest.raises(EmptyQueryError):
        search_log(db_path, ["--"])


def test_new_entries_are_found_on_the_next_search(db_path: Path) -> None:
    _two_sessions(db_path)
    assert search_log(db_path, ["gallium"]) == []
    with SessionLog.open(db_path) as log:
        _exchange(log, "alpha", "And gallium?", "It melts in the hand.")
    assert [h.seq for h in search_log(db_path, ["gallium"])] == [4]


def test_a_compactions_copies_are_not_found_twice(db_path: Path) -> None:
    _two_sessions(db_path)
    with SessionLog.open(db_path) as log:
        log.start_epoch(
            "alpha", reason="compaction", tools_text=TOOLS, system_text="v2", carry_over=True
        )
        assert len(log.entries("alpha")) > 4  # the copies are there
    assert [h.seq for h in search_log(db_path, ["parser"], session="alpha")] == [3, 2]


def test_the_log_is_only_read(db_path: Path) -> None:
    _two_sessions(db_path)
    with SessionLog.open(db_path) as log:  # the daemon's WAL folded in, as after a clean stop
        log.sessions()
    before = _digest(db_path)
    assert search_log(db_path, ["parser"])
    assert search_log(db_path, ["stream"])
    assert _digest(db_path) == before
    assert index_path(db_path).exists()


def test_no_log_yet_finds_nothing_and_creates_nothing(tmp_path: Path) -> None:
    assert search_log(tmp_path / "loopd.db", ["anything"]) == []
    assert list(tmp_path.iterdir()) == []


def test_a_foreign_file_is_refused(db_path: Path) -> None:
    db_path.write_text("not a database")
    with pytest.raises(NotALogError):
        search_log(db_path, ["x"])
    assert db_path.read_text() == "not a database"


def test_a_deleted_or_damaged_index_is_rebuilt(db_path: Path) -> None:
    _two_sessions(db_path)
    first = search_log(db_path, ["parser"])
    index_path(db_path).unlink()
    assert search_log(db_path, ["parser"]) == first
    for extra in index_path(db_path).parent.glob("search.db-*"):
        extra.unlink()
    index_path(db_path).write_bytes(b"garbage" * 100)
    assert search_log(db_path, ["parser"]) == first


def test_an_index_of_another_log_is_rebuilt(tmp_path: Path) -> None:
    db_path = tmp_path / "loopd.db"
    _two_sessions(db_path)
    assert search_log(db_path, ["parser"])
    other = tmp_path / "other" / "loopd.db"
    other.parent.mkdir()
    with open_started(other, "gamma") as log:
        _exchange(log, "gamma", "Only words about tin.", "Tin it is.")
        _exchange(log, "gamma", "More tin?", "More tin.")
        _exchange(log, "gamma", "Still tin.", "Tin.")
    for path in tmp_path.glob("loopd.db*"):
        path.unlink()
    for path in other.parent.glob("loopd.db*"):
        path.rename(tmp_path / path.name)  # a restored backup: another log, the old index
    assert search_log(db_path, ["parser"]) == []
    assert [h.session for h in search_log(db_path, ["tin"])] == ["gamma"] * 6


def damage_pages(path: Path) -> int:
    """Overwrite every page of the SQLite file at ``path`` but the first (its header and
    schema): it opens, and the first read of a table finds it malformed. The pages damaged."""
    data = bytearray(path.read_bytes())
    page = int.from_bytes(data[16:18], "big") or 65536
    for start in range(page, len(data), page):
        data[start : start + page] = b"\xa5" * page
    path.write_bytes(bytes(data))
    return len(data) // page - 1


async def log_search(state_dir: str, *words: str) -> int:
    """``loopd log search WORDS`` on the log in ``state_dir``, as the command line runs it."""
    os.environ["LOOPD_STATE_DIR"] = state_dir
    return main(["log", "search", *words])


def test_loopd_log_search_rebuilds_a_damaged_index_and_never_blames_the_log(
    tmp_path: Path,
) -> None:
    db_path = tmp_path / "loopd.db"
    with open_started(db_path, "alpha") as log:
        for n in range(200):
            _exchange(log, "alpha", f"Question {n} about the parser?", f"Answer {n}: stream.")
    assert len(search_log(db_path, ["parser"], limit=500)) == 200
    for extra in tmp_path.glob("search.db-*"):  # the index as a closed file holds it
        extra.unlink()
    damaged = damage_pages(index_path(db_path))
    log_bytes = _digest(db_path)
    watched = run_watched(f"{__name__}:log_search", str(tmp_path), "parser", "199")
    print(f"{damaged} pages of search.db damaged; `loopd log search parser 199` wrote:")
    print(watched.output.rstrip())
    print(f"{watched.line.split(', longest')[0]} (the command runs no event loop)")
    assert watched.result == 0
    hits = [line for line in watched.output.splitlines() if "alpha" in line]
    assert len(hits) == 1  # the question of exchange 199
    assert "the search index" in watched.output
    assert "it is built again from the session log" in watched.output
    assert "session log" not in watched.output.replace("from the session log", "")
    assert _digest(db_path) == log_bytes  # the log itself untouched
    assert len(search_log(db_path, ["parser"], limit=500)) == 200


def test_an_index_that_fails_again_is_named_not_the_log(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _two_sessions(db_path)

    def broken(*args: object) -> None:
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(search, "_bring_up_to_date", broken)
    with pytest.raises(search.SearchIndexError) as failed:
        search_log(db_path, ["parser"])
    assert str(failed.value).startswith(f"search index {index_path(db_path)}: failed again")
