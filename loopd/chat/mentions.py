"""What loopd posts mentions nobody: every ``@`` that Mattermost would read as a mention becomes
U+FF20, the full-width commercial at. Pure.

Mattermost finds mentions in a post's text outside code: a word starting with the ASCII ``@``
followed by a letter or digit (``@channel``, ``@all``, ``@here``, ``@username``), where a word is
a run of letters, digits and ``.-_:@``. U+FF20 is none of those, so ``\\uff20channel`` is the word
``channel``: no mention, and it reads as one. It is one character for one, so a post keeps the
length it was split to (``loopd.chat.split``), and defusing twice changes nothing. An ``@`` inside
a word (``me@example.com``) is no mention and stays. Code (closed fences and code spans) stays as
written, since Mattermost reads no mention there and a reader copies it; a fence not yet closed
(an answer still being written) is text, since it may never be closed.

A person is mentioned only where a person in the thread asked for it: the names in ``keep``,
the thread's people and the names they wrote themselves (``thread_people`` in
``loopd.chat.threads``), stay mentions; every other name is defused, so nobody outside the thread
is pinged by what the model wrote. ``@channel``, ``@all`` and ``@here`` are always defused, even
where a person wrote them.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Final

from loopd.chat.intake import CODE_SPAN

DEFUSED_AT: Final = "\uff20"
# Only a closed fence is code here (intake's rule also takes one open to the end of the text).
_CLOSED_FENCE: Final = re.compile(r"^ {0,3}(`{3,}|~{3,}).*?$.*?^ {0,3}\1[`~]*[ \t]*$", re.M | re.S)
CHANNEL_WIDE: Final = frozenset({"channel", "all", "here"})
# An ``@`` with no letter, digit or ``_`` before it and a name after it (``.-_:`` may come first:
# wider than Mattermost's rule, so that no reading of it is missed); the name ends at a letter or
# digit, as Mattermost trims the punctuation after it.
_MENTION: Final = re.compile(r"(?<!\w)@([\w.\-:]*[^\W_])")


def defuse(text: str, keep: frozenset[str] = frozenset()) -> str:
    """``text`` with every mention defused outside code, but those of the names in ``keep``
    (lower case; never the channel-wide ones)."""
    if "@" not in text:
        return text
    allowed = keep - CHANNEL_WIDE

    def defused(prose: str) -> str:
        return _MENTION.sub(lambda m: _one(m, allowed), prose)

    return _outside(text, _CLOSED_FENCE, lambda prose: _outside(prose, CODE_SPAN, defused))


def named(text: str) -> frozenset[str]:
    """The names ``text`` mentions outside code (lower case)."""
    found: set[str] = set()

    def collect(prose: str) -> str:
        found.update(m.group(1).lower() for m in _MENTION.finditer(prose))
        return prose

    _outside(text, _CLOSED_FENCE, lambda prose: _outside(prose, CODE_SPAN, collect))
    return frozenset(found)


def _one(match: re.Match[str], allowed: frozenset[str]) -> str:
    name = match.group(1)
    return match.group(0) if name.lower() in allowed else DEFUSED_AT + name


def _outside(text: str, code: re.Pattern[str], change: Callable[[str], str]) -> str:
    pieces, at = [], 0
    for match in code.finditer(text):
        pieces += [change(text[at : match.start()]), match.group(0)]
        at = match.end()
    pieces.append(change(text[at:]))
    return "".join(pieces)
