"""The pure side of searching the log (``loopd.sessionlog.searchtext``): a person's words as an
FTS5 query that no word can turn into an operator, what of a message is searched, and the line of
context a hit is shown with."""

from __future__ import annotations

import sqlite3

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loopd.sessionlog.searchtext import (
    EmptyQueryError,
    Hit,
    context_line,
    fts_query,
    search_words,
    searchable_text,
)
from tests.sessionlog.sessionlog_support import assistant_text


def test_every_word_is_a_quoted_phrase_and_all_must_match() -> None:
    assert fts_query(["cache", "reuse"]) == '"cache" "reuse"'
    assert fts_query(["cache reuse"]) == '"cache" "reuse"'
    assert fts_query(['say "hi"']) == '"say" """hi"""'
    assert fts_query(["0\x00a"]) == '"0" "a"'


@pytest.mark.parametrize("words", [[], [""], ["  "], ["*", "--", "()"], ['"']])
def test_words_with_nothing_to_match_are_refused(words: list[str]) -> None:
    with pytest.raises(EmptyQueryError, match="nothing to search for"):
        fts_query(words)
    assert search_words(words) == []


def _fts() -> sqlite3.Connection:
    db = sqlite3.connect(":memory:")
    db.execute("CREATE VIRTUAL TABLE t USING fts5(text, tokenize='unicode61 remove_diacritics 2')")
    rows = [
        ("apples OR pears",),
        ("apples only",),
        ("pears only",),
        ("NOT here",),
        ('text:col "quoted" NEAR(a b) prefix* ^start',),
    ]
    db.executemany("INSERT INTO t (text) VALUES (?)", rows)
    return db


def _found(db: sqlite3.Connection, words: list[str]) -> list[str]:
    rows = db.execute("SELECT text FROM t WHERE t MATCH ? ORDER BY rowid", (fts_query(words),))
    return [row[0] for row in rows]


def test_operators_typed_as_words_are_searched_as_text() -> None:
    db = _fts()
    # OR as a word is a word: only the entry that holds all three
    assert _found(db, ["apples", "OR", "pears"]) == ["apples OR pears"]
    assert _found(db, ["NOT"]) == ["NOT here"]
    assert _found(db, ["text:col"]) == ['text:col "quoted" NEAR(a b) prefix* ^start']
    assert _found(db, ["NEAR(a", "b)"]) == ['text:col "quoted" NEAR(a b) prefix* ^start']
    assert _found(db, ["pre*"]) == []  # no prefix search: the word is "pre"
    assert _found(db, ["^start"]) == ['text:col "quoted" NEAR(a b) prefix* ^start']


@given(st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=4))
def test_no_words_make_a_query_fts5_refuses(words: list[str]) -> None:
    db = _fts()
    try:
        query = fts_query(words)
    except EmptyQueryError:
        return
    db.execute("SELECT count(*) FROM t WHERE t MATCH ?", (query,)).fetchone()


def test_the_searched_text_is_the_content_and_the_tool_calls() -> None:
    assert searchable_text('{"role": "user", "content": "hello there"}') == "hello there"
    message = assistant_text("let me look", calls=[("c1", "read_file", '{"path": "notes.md"}')])
    assert searchable_text(message) == 'let me look\nread_file\n{"path": "notes.md"}'
    parts = '{"role": "user", "content": [{"type": "text", "text": "a picture of"}]}'
    assert searchable_text(parts) == "a picture of"
    assert searchable_text("not json") == "not json"


def test_the_context_is_one_bounded_line_around_the_first_word() -> None:
    text = "First line.\n\n" + "filler " * 40 + "the NEEDLE is here " + "after " * 40
    line = context_line(text, ["needle"], width=60)
    assert "\n" not in line
    assert len(line) == 60
    assert line.startswith("…")
    assert line.endswith("…")
    assert "NEEDLE is here" in line
    assert line.index("NEEDLE") < 30  # a few words before it, more after
    assert context_line("short\ntext", ["x"]) == "short text"
    start = context_line("word " * 50, ["absent"], width=20)
    assert start == "word word word word…"


@given(st.text(max_size=300), st.lists(st.text(max_size=8), max_size=3), st.integers(10, 120))
def test_the_context_never_exceeds_its_width(text: str, words: list[str], width: int) -> None:
    line = context_line(text, words, width)
    assert len(line) <= width
    assert "\n" not in line


def test_a_hit_is_one_line() -> None:
    hit = Hit("tty", 7, "assistant", "2026-12-03T06:58:01.123456+00:00", "the context")
    assert hit.line() == "2026-12-03 06:58  tty #7 assistant: the context"
