"""An answer's Markdown as a terminal shows it (``rich``), a block at a time. Pure: text in, text
out; nothing is written here.

How it reads (``TurnView`` does the writing): the answer streams raw as the model writes it, so
the first words show at once; when a Markdown block is complete (a blank line outside a code
fence, or the end of the answer) the raw lines of that block are erased and the block is written
again rendered: headings, lists, emphasis, code. Rendering the whole answer again at each token
(``rich.live``) redraws what scrolled away and flickers, and rendering only at the end leaves a
long answer raw while it is read; a finished block never changes again, so it is drawn once.
A block taller than the screen cannot be erased (its top has scrolled away) and stays raw.

Model text is never obeyed: it passes ``for_terminal`` before rich parses it, and every piece of
text rich renders passes it again (a numeric entity such as ``&#x1b;`` decodes to a control
character inside the parser). Rich's own markup (``[bold]``, ``[link=...]``) and emoji codes are
off, so they show as typed, and links are written as text with their address in parentheses,
never as terminal hyperlinks (OSC 8), so what a link says is where it goes.
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Iterable
from typing import Final

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.markdown import Markdown
from rich.segment import Segment

from loopcommon.sanitize import for_terminal

_FENCE: Final = re.compile(r" {0,3}(```|~~~)")
_TAB: Final = 8
_PADDING: Final = re.compile(r" +$", re.MULTILINE)  # rich pads unstyled lines to the width
ERASE_BELOW: Final = "\x1b[J"


def split_blocks(text: str) -> tuple[str, str]:
    """``text`` cut after its last blank line outside a code fence: the complete blocks (with
    the blank lines after them), and the rest, still being written. A line without its newline
    is not complete yet."""
    fenced = False
    cut = 0
    at = 0
    for line in text.splitlines(keepends=True):
        at += len(line)
        if not line.endswith("\n"):
            break
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced and not line.strip():
            cut = at
    return text[:cut], text[cut:]


def screen_rows(shown: str, width: int) -> int:
    """The rows ``shown`` takes, written from the start of a row on a screen ``width`` wide (the
    cursor ends on the last one)."""
    return sum(
        max(1, math.ceil(cell_len(line.expandtabs(_TAB)) / width)) for line in shown.split("\n")
    )


def erase_rows(rows: int) -> str:
    """Back to the start of the first of the last ``rows`` rows, and everything from there on
    erased."""
    up = f"\x1b[{rows - 1}A" if rows > 1 else ""
    return "\r" + up + ERASE_BELOW


def render(text: str, width: int) -> str:
    """``text`` (Markdown from the model) as styled terminal text ``width`` wide, ending with one
    newline and no blank line before or after."""
    buffer = io.StringIO()
    console = Console(
        file=buffer,
        width=width,
        force_terminal=True,
        color_system="standard",  # 16 colours: what every terminal has
        markup=False,
        emoji=False,
        highlight=False,
        legacy_windows=False,
    )
    console.print(_Shown(Markdown(for_terminal(text), hyperlinks=False)))
    rendered = _PADDING.sub("", buffer.getvalue())
    return rendered.strip("\n") + "\n"


class _Shown:
    """A renderable whose every piece of text passes ``for_terminal``."""

    def __init__(self, inner: Markdown) -> None:
        self.inner = inner

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        segments: Iterable[Segment] = console.render(self.inner, options)
        for segment in segments:
            if segment.control:  # none from Markdown; never passed on
                continue
            yield Segment(for_terminal(segment.text), segment.style)
