"""The one rule for text that reaches people: every hidden character shown as a label, nothing
else changed, and applying it again changes nothing."""

from __future__ import annotations

import unicodedata

from hypothesis import example, given
from hypothesis import strategies as st

from loopcommon.sanitize import for_terminal, is_hidden, label, visible

# Where the tricks live: the controls, the bidi and zero-width characters, the tag characters,
# the separators, the pictographs a joiner may join, and ordinary letters of several scripts.
TRICKY = st.sampled_from(
    "\x00\x07\x1b\r\n\t\x7f\x85\x9b\u00ad\u061c\u200b\u200c\u200d\u200e\u200f\u202a\u202b"
    "\u202c\u202d\u202e\u2060\u2066\u2067\u2068\u2069\u2028\u2029\ufeff\U000e0041\U000e007f"
    "\ue000\ufe0f\U0001f3fd👩💻🏳🌈a zé<>U+0123456789ABCDEFאבعر"
)
TEXT = st.text(st.one_of(TRICKY, st.characters()))


def hidden_left(shown: str) -> list[str]:
    """Hidden characters ``shown`` still holds, but a joiner between two pictographs."""
    left = []
    for at, char in enumerate(shown):
        if char == "\u200d" and 0 < at < len(shown) - 1:
            before = shown[:at].rstrip("\ufe0f\U0001f3fd")[-1:]
            pictographs = [unicodedata.category(c) for c in (before or " ", shown[at + 1])]
            if pictographs == ["So", "So"]:
                continue
        if is_hidden(char):
            left.append(char)
    return left


@given(TEXT)
@example("report\u202efdp.sh")
def test_no_hidden_character_is_left(text: str) -> None:
    assert hidden_left(visible(text)) == []


@given(TEXT)
def test_applying_it_again_changes_nothing(text: str) -> None:
    once = visible(text)
    assert visible(once) == once


@given(st.text(st.characters(exclude_categories=("Cc", "Cf", "Zl", "Zp", "Cs", "Co"))))
def test_text_without_hidden_characters_is_unchanged(text: str) -> None:
    assert visible(text) == text


@given(st.lists(st.one_of(TRICKY, st.characters()).filter(lambda c: c not in "\r\u200d")))
def test_each_hidden_character_becomes_its_label_in_place(chars: list[str]) -> None:
    # Without a carriage return (``\r\n`` is one newline) or a joiner (kept between pictographs),
    # the rule works character by character.
    assert visible("".join(chars)) == "".join(label(c) if is_hidden(c) else c for c in chars)


def test_the_labels_people_read() -> None:
    assert visible("report\u202efdp.sh") == "report<U+202E>fdp.sh"
    assert visible("pay\u200bpal \ufeff\u2066x\u2069") == "pay<U+200B>pal <U+FEFF><U+2066>x<U+2069>"
    assert visible("a\tb\r\nc\rd\x00\x1b[2J\x7f\x9b") == "a\tb\nc␍d␀␛[2J␡<U+009B>"
    assert visible("tag\U000e0041\u2028end") == "tag<U+E0041><U+2028>end"
    # A joiner draws one emoji between two pictographs, and is shown anywhere else.
    assert visible("👩‍💻 🏳️‍🌈 a\u200db 👩\u200d") == "👩‍💻 🏳️‍🌈 a<U+200D>b 👩<U+200D>"
    assert visible("café ここ עברית") == "café ここ עברית"


def test_the_terminal_uses_the_same_rule() -> None:
    assert for_terminal is visible
