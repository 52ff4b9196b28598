"""Split an answer into posts of at most ``limit`` characters (runes), on paragraph or line
boundaries, never leaving a code fence open: a fence cut in two is closed at the end of one post
and reopened, with its info string, at the start of the next."""

from __future__ import annotations

import re

MAX_POST_RUNES = 16383  # MaxPostSize of a default server
_FENCE_LINE = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")
_CLOSE_RESERVE = 16  # room for "\n" + a closing fence


def split_message(text: str, limit: int = MAX_POST_RUNES) -> list[str]:
    """The posts for ``text``; a text within the limit is one post, unchanged."""
    if limit < 4 * _CLOSE_RESERVE:
        raise ValueError(f"a post limit of {limit} characters is too small to split into")
    posts: list[str] = []
    rest = text
    while len(rest) > limit:
        cut, skip = _choose_cut(rest, limit - _CLOSE_RESERVE)
        head, rest = rest[:cut], rest[cut + skip :]
        fence = open_fence(head)
        if fence is not None:
            marker, opener = fence
            head = head.rstrip("\n") + "\n" + marker
            rest = opener[: _CLOSE_RESERVE * 4] + "\n" + rest
        posts.append(head)
    posts.append(rest)
    return [p for p in posts if p.strip()] or [text[:limit]]


def open_fence(text: str) -> tuple[str, str] | None:
    """(closing marker, opening line) of a fence left open at the end of ``text``, if any."""
    current: tuple[str, str] | None = None
    for line in text.split("\n"):
        match = _FENCE_LINE.match(line)
        if match is None:
            continue
        chars, info = match.group(1), match.group(2)
        if current is None:
            current = (chars, line.strip())
        elif chars[0] == current[0][0] and len(chars) >= len(current[0]) and not info.strip():
            current = None
    return current


def _choose_cut(text: str, budget: int) -> tuple[int, int]:
    """Where to cut within ``budget`` characters, and how many separator characters to drop.

    Preference: a paragraph break outside a fence, then any line break, then a space, then a
    hard cut. A boundary in the first half of the budget is passed over for a later one, so no
    post is tiny."""
    floor = budget // 2
    window = text[: budget + 1]
    position = window.rfind("\n\n")
    while position >= floor:
        if open_fence(text[:position]) is None:
            return position, 2
        position = window.rfind("\n\n", 0, position)
    for separator in ("\n", " "):
        position = window.rfind(separator)
        if position >= floor:
            return position, 1
    return budget, 0
