"""The text side of searching the session log: what a person's words become as a full-text query,
what of an entry is searched, and the one line of context a hit is shown with. Pure.

A person types words, not FTS5 syntax: every word is one quoted phrase of the query, so ``OR``,
``NOT``, ``NEAR``, ``*``, ``^``, ``:``, parentheses and quotes are searched for as text and can
never act as operators (a ``"`` inside a word is doubled, FTS5's escape inside a string). The
phrases are joined by spaces, FTS5's implicit AND: a hit mentions every word. A word with no letter
or digit in it gives the tokenizer nothing to match and is left out.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

CONTEXT_CHARS: Final = 100  # a hit's line of context, at most
_ELLIPSIS: Final = "…"
# What FTS5's unicode61 tokenizer keeps of a word (letters and digits; the rest separates tokens).
_TOKEN: Final = re.compile(r"[^\W_]+")


class EmptyQueryError(ValueError):
    """The words hold nothing to search for (no letter or digit)."""

    def __init__(self) -> None:
        super().__init__("nothing to search for: give a word with a letter or digit in it")


def search_words(words: Sequence[str]) -> list[str]:
    """The words that can match, split at whitespace and NUL (``["a b"]`` is two words)."""
    # NUL ends a string in SQLite's C API: the query would end there, its quote unclosed.
    split = (word for text in words for word in text.replace("\x00", " ").split())
    return [word for word in split if _TOKEN.search(word)]


def fts_query(words: Sequence[str]) -> str:
    """The FTS5 query that finds entries holding every word, each taken as text."""
    kept = search_words(words)
    if not kept:
        raise EmptyQueryError
    return " ".join('"' + word.replace('"', '""') + '"' for word in kept)


def searchable_text(message: str) -> str:
    """What of a stored message (its JSON text) is searched: the content, and the name and
    arguments of each tool call an assistant message makes. Text that is not a JSON object is
    searched as it is."""
    try:
        parsed = json.loads(message)
    except ValueError:
        return message
    if not isinstance(parsed, dict):
        return message
    parts = [_content_text(parsed.get("content"))]
    for call in parsed.get("tool_calls") or []:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            parts += [str(function.get("name") or ""), str(function.get("arguments") or "")]
    return "\n".join(part for part in parts if part)


def _content_text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: the text ones
        return "\n".join(str(part.get("text") or "") for part in content if isinstance(part, dict))
    return ""


def context_line(text: str, words: Sequence[str], width: int = CONTEXT_CHARS) -> str:
    """One line of ``text`` around the first place a word's token appears (case-insensitive), its
    whitespace folded to single spaces, at most ``width`` characters, with ``…`` where it was cut.
    Where no token is found as written (the index also folds diacritics), the text's start."""
    flat = " ".join(text.split())
    width = max(width, 10)
    if len(flat) <= width:
        return flat
    at = _first_token(flat, words)
    # The match a quarter of the way in: some words before it to read it by, more after.
    start = max(0, min(at - width // 4, len(flat) - width))
    end = start + width
    head = _ELLIPSIS if start > 0 else ""
    tail = _ELLIPSIS if end < len(flat) else ""
    return head + flat[start + len(head) : end - len(tail)] + tail


def _first_token(flat: str, words: Sequence[str]) -> int:
    folded = flat.casefold()
    found = [
        folded.find(token.casefold())
        for word in words
        for token in _TOKEN.findall(word)
        if token.casefold() in folded
    ]
    return min(found, default=0)


@dataclass(frozen=True)
class Hit:
    """One entry that mentions the words."""

    session: str
    seq: int
    kind: str
    created_at: str
    context: str

    def line(self) -> str:
        """``2026-12-03 06:58  SESSION #SEQ KIND: context``, one line."""
        when = self.created_at[:16].replace("T", " ")
        return f"{when}  {self.session} #{self.seq} {self.kind}: {self.context}"
