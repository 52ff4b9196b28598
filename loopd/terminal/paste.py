"""A paste at the prompt: read whole, and drawn as one short line when it is long.

The terminal marks a paste (bracketed paste: ``ESC [200~`` before it, ``ESC [201~`` after). loopd
reads it itself (``read_paste``: readline would draw it line by line, 15,000 lines taking seconds),
with every byte in it text, control bytes included (the prompt takes the terminal's signal keys as
keys: ``lineinput``). A short paste goes into the line as typed text; a long one (``is_long``) is
kept aside and the line shows ``[pasted 15,000 lines]`` in its place, which the message gets back
whole when it is sent (``Pastes.expand``). The line can be edited around it, and recalled from this
chat's history.
"""

from __future__ import annotations

import os
import select
from dataclasses import dataclass, field
from typing import Final

START: Final = "\x1b[200~"
END: Final = b"\x1b[201~"
# A paste of more than this is drawn as one line.
SHOWN_LINES: Final = 10
SHOWN_CHARS: Final = 2000
# A terminal that starts a paste and never ends it: what came is taken after this silence.
SILENCE_S: Final = 2.0


def is_long(text: str) -> bool:
    return text.count("\n") >= SHOWN_LINES or len(text) > SHOWN_CHARS


def pasted_text(data: bytes) -> str:
    """A paste's bytes as text: UTF-8 (a byte that is not is shown as U+FFFD), with the
    terminal's line ends (``\\r``) as newlines. Pure."""
    return data.decode("utf-8", "replace").replace("\r\n", "\n").replace("\r", "\n")


@dataclass
class Pastes:
    """The long pastes of this chat, each behind the placeholder its line shows."""

    kept: dict[str, str] = field(default_factory=dict)

    def keep(self, text: str) -> str:
        """The placeholder for ``text``, which ``expand`` puts back."""
        lines = text.count("\n") + (0 if text.endswith("\n") else 1)
        size = f"{lines:,} lines" if lines > 1 else f"{len(text):,} characters"
        placeholder, number = f"[pasted {size}]", 1
        while placeholder in self.kept and self.kept[placeholder] != text:
            number += 1
            placeholder = f"[pasted {size} #{number}]"
        self.kept[placeholder] = text
        return placeholder

    def expand(self, line: str) -> str:
        """``line`` with each placeholder it holds replaced by its paste."""
        for placeholder, text in self.kept.items():
            if placeholder in line:
                line = line.replace(placeholder, text)
        return line

    def holds(self, line: str) -> bool:
        return any(placeholder in line for placeholder in self.kept)


def read_paste(fd: int) -> tuple[bytes, bytes]:
    """The bytes of a paste whose start marker was just read, up to its end marker; and the
    bytes read after that marker (keys typed right after the paste)."""
    data = bytearray()
    while select.select([fd], [], [], SILENCE_S)[0]:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        data += chunk
        at = data.find(END, max(len(data) - len(chunk) - len(END), 0))
        if at >= 0:
            return bytes(data[:at]), bytes(data[at + len(END) :])
    return bytes(data), b""
