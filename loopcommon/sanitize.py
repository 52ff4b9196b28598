"""Text that reaches people, shown exactly as it reads: one rule for every exit. Pure.

Text from the model, the box, a tool or another person can hold characters a reader cannot see,
or that change how what stands beside them reads: a right-to-left override makes
``report\\u202efdp.sh`` read ``reporths.pdf``; a zero-width space makes two different names look
alike; a terminal obeys ESC and the C1 controls (U+0080 to U+009F; U+009B is a CSI on its own),
which clear the screen, set the window title, plant a hyperlink (OSC 8) or write the clipboard
(OSC 52); a bare carriage return or a backspace writes over what is already shown. So every such
character is shown as what it is, never passed on (``visible``):

- a C0 control as its Control Pictures glyph (ESC as ``␛``), DEL as ``␡``;
- a C1 control, a format character (the bidi controls, the zero-width characters, the tag
  characters, the soft hyphen, the byte order mark ...), a line or paragraph separator (U+2028,
  U+2029), a surrogate and a private-use character as ``<U+XXXX>``.

Newlines and tabs stay, and so does ``\\r\\n`` (as a newline). A zero-width joiner stays between
two pictographs, where it draws one emoji (``👩‍💻``); anywhere else it is shown. What follows an
escaped ESC (``]52;c;...``) is then plain text. A label holds no control and no right-to-left
letter, so it reorders nothing beside it, and ``visible`` of its own output changes nothing: an
exit may apply it again.

Each exit applies it once to all it sends: ``loopd.chat.rest`` to every post and edit (and the
outbox before it splits a post, so that a part keeps its length), the terminal to what came
from outside (``for_terminal``), and the status page to each label, which it also isolates
(``<bdi>``) so that right-to-left letters in one cannot reorder its neighbours. ``--json`` and
piped output are data and stay as written.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Final

_KEPT: Final = frozenset("\n\t")
_DEL: Final = 0x7F
_CONTROL_PICTURES: Final = 0x2400  # U+2400 + code: the picture of C0 control ``code``
_ZWJ: Final = "\u200d"
# Categories shown as labels: controls, format characters, line and paragraph separators,
# surrogates (not text; they cannot even be encoded) and private use (no agreed glyph).
_SHOWN_CATEGORIES: Final = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs", "Co"})
# What a pictograph's joiner may follow: the pictograph, then its modifiers (a skin tone is Sk,
# the emoji presentation selector U+FE0F is Mn).
_PICTOGRAPH: Final = "So"
_MODIFIERS: Final = frozenset({"Mn", "Me", "Sk"})
# The common case needs no look at each character: newline, tab and printable ASCII.
_ALL_PLAIN: Final = re.compile(r"[\n\t -~]*")


def is_hidden(char: str) -> bool:
    """Whether ``visible`` shows ``char`` as a label (a zero-width joiner: unless it joins two
    pictographs)."""
    return char not in _KEPT and unicodedata.category(char) in _SHOWN_CATEGORIES


def label(char: str) -> str:
    """How ``visible`` shows a hidden character."""
    code = ord(char)
    if code < 0x20:
        return chr(_CONTROL_PICTURES + code)
    if code == _DEL:
        return "\u2421"
    return f"<U+{code:04X}>"


def visible(text: str) -> str:
    """``text`` with every control, format and separator character shown instead of obeyed."""
    if _ALL_PLAIN.fullmatch(text):
        return text  # the common case: nothing to look at
    text = text.replace("\r\n", "\n")
    shown = []
    for at, char in enumerate(text):
        if not is_hidden(char) or (char == _ZWJ and _joins_pictographs(text, at)):
            shown.append(char)
        else:
            shown.append(label(char))
    return "".join(shown)


def _joins_pictographs(text: str, at: int) -> bool:
    """The joiner at ``at`` stands between two pictographs (modifiers after the first)."""
    after = text[at + 1 : at + 2]
    if not after or unicodedata.category(after) != _PICTOGRAPH:
        return False
    before = at - 1
    while before >= 0 and unicodedata.category(text[before]) in _MODIFIERS:
        before -= 1
    return before >= 0 and unicodedata.category(text[before]) == _PICTOGRAPH


# The terminal's name for the rule: what came from outside passes it before it is drawn.
for_terminal: Final = visible
