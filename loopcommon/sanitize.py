"""Text from the model or the box, made safe to show on a terminal. Pure.

A terminal obeys what it is sent: ESC and the C1 controls (U+0080 to U+009F; U+009B is a CSI on
its own) start sequences that clear the screen, set the window title, plant a hyperlink (OSC 8)
or write the clipboard (OSC 52); a bare carriage return or a backspace writes over what is
already shown; a bidi override reorders what follows it. So every character of such text that
is not printable is shown as what it is, never sent: a C0 control as its Control Pictures glyph
(ESC as ``␛``), DEL as ``␡``, and a C1 control or a bidi control as ``<U+XXXX>``. Other format
characters stay (a zero-width joiner holds an emoji sequence together). Newlines and tabs stay,
and so does ``\\r\\n`` (as a newline). What follows an escaped ESC (``]52;c;...``) is then plain
text. Only what goes to a terminal passes here: ``--json`` and piped output are data
and stay as written.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Final

_KEPT: Final = frozenset("\n\t")
_DEL: Final = 0x7F
_CONTROL_PICTURES: Final = 0x2400  # U+2400 + code: the picture of C0 control ``code``
_UNSAFE: Final = re.compile(r"[^\n\t -~]")  # anything but newline, tab and printable ASCII
# The bidi controls (marks, embeddings, overrides, isolates): they reorder what is shown.
_BIDI: Final = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def _shown(char: str) -> str:
    code = ord(char)
    if code < 0x20:
        return chr(_CONTROL_PICTURES + code)
    if code == _DEL:
        return "\u2421"
    if char in _BIDI or unicodedata.category(char) == "Cc":
        return f"<U+{code:04X}>"
    return char


def for_terminal(text: str) -> str:
    """``text`` with every control character and bidi control shown instead of obeyed."""
    text = text.replace("\r\n", "\n")
    if _UNSAFE.search(text) is None:
        return text  # the common case: nothing to look at
    return "".join(char if char in _KEPT else _shown(char) for char in text)
