"""What a turn looks like in a terminal, as text. Pure: the shell feeds it what happened (the
engine's statuses, each tool call and its result, the turn's end) and writes what it returns.

With ``Style.TERMINAL`` (stdout is a terminal) the answer appears as it is written; thinking is
dimmed and folded into one line that ends as a one-line summary (``show_thinking``: written out
whole, dimmed); each tool call gets a line with its name and short arguments, then one with the
start of its result; while the turn waits or reads the prompt, one transient line says so, in the
wording every surface uses (``engine.progress.phase_words``). With ``Style.PLAIN`` (stdout is a
file or a pipe) nothing is written during the turn and the answer is written whole at its end, so
a script reading stdout gets the answers and nothing else.

With ``markdown`` (the terminal's chat and run) each block of the answer, once complete, is
written again rendered (``loopd.terminal.markdown`` says how, and why so); without it, and always
with ``Style.PLAIN``, the answer is the model's text as written.

Every piece of text that came from the model or the box (the answer, the thinking, a tool's name,
arguments and result, a notice, a failure) passes ``for_terminal`` before it is written with
``Style.TERMINAL``, so it shows as text and is never obeyed as a terminal control; the escapes
here are loopd's own. A failure's line goes to stderr, a diagnostic, so it passes in both styles.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from loopcommon.sanitize import for_terminal
from loopd.chat.status import InLine, in_line_words
from loopd.engine.notes import cut_note
from loopd.engine.outcome import TurnOutcome
from loopd.engine.progress import Phase, Status, phase_words

DIM = "\x1b[2m"
BOLD = "\x1b[1m"
RESET = "\x1b[0m"
CLEAR_LINE = "\r\x1b[2K"  # back to the line's start, and erase it

_ARGUMENT_CHARS = 40  # each argument value of a tool call line, at most
_ELLIPSIS = "…"


class Style(Enum):
    TERMINAL = "terminal"
    PLAIN = "plain"


@dataclass(frozen=True)
class TurnEndText:
    """What to write when a turn ends: ``out`` to stdout, ``err`` (a failure's line) to stderr."""

    out: str
    err: str = ""


def fit(text: str, width: int) -> str:
    """``text`` on one line, cut to ``width`` characters with a mark when it was longer."""
    flat = " ".join(text.split())
    if len(flat) <= width:
        return flat
    return flat[: max(width - 1, 0)] + _ELLIPSIS


def tail(text: str, width: int) -> str:
    """The end of ``text`` on one line, at most ``width`` characters (a mark when cut)."""
    flat = " ".join(text.split())
    if len(flat) <= width:
        return flat
    return _ELLIPSIS + flat[len(flat) - max(width - 1, 0) :]


def short_arguments(arguments: str, width: int) -> str:
    """A tool call's JSON arguments as ``name=value, ...`` on one line (the raw text when they are
    not a JSON object)."""
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return fit(arguments, width)
    if not isinstance(parsed, dict):
        return fit(arguments, width)
    parts = [
        f"{key}={fit(json.dumps(value, ensure_ascii=False), _ARGUMENT_CHARS)}"
        for key, value in parsed.items()
    ]
    return fit(", ".join(parts), width)


def short_result(result: str, width: int) -> str:
    """The first line of a tool's result, and how many lines followed."""
    lines = [line for line in result.splitlines() if line.strip()]
    if not lines:
        return "(empty)"
    more = f" (+{len(lines) - 1} lines)" if len(lines) > 1 else ""
    return fit(lines[0], max(width - len(more), 10)) + more


class TurnView:
    """One turn's rendering; each method returns the text to write (possibly empty).

    It keeps track of the screen: a transient line (a status, the folded thinking) is erased
    before anything lasting is written, and a lasting line left open (an answer still being
    written) is ended before a tool line or a status.
    """

    def __init__(
        self,
        style: Style,
        *,
        show_thinking: bool = False,
        width: int = 80,
        height: int = 24,
        markdown: bool = False,
    ) -> None:
        self.style = style
        self.show_thinking = show_thinking
        self.width = max(width, 20)
        self.height = height
        self.markdown = markdown and style is Style.TERMINAL
        self._block = ""  # markdown: the answer's block being written, as the model wrote it
        self._block_shown = ""  # ... and as it was written raw to the screen
        self._transient = False  # a transient line is on screen
        self._open = False  # the cursor is after lasting text, not at a line's start
        self._answer = ""  # the current request's answer, as written so far
        self._thought = ""  # the current request's thinking, as seen so far
        self._thought_tokens = 0
        self._thought_written = 0  # show_thinking: characters of it written

    # -- during the turn ------------------------------------------------------------------------

    def status(self, status: Status) -> str:
        if self.style is Style.PLAIN:
            return ""
        match status.phase:
            case Phase.THINKING:
                return self._thinking(status)
            case Phase.ANSWERING:
                return self._answering(status.text)
            case _:
                return self._settle_thinking() + self._transient_line(phase_words(status))

    def in_line(self, in_line: InLine) -> str:
        """Waiting for the session's slot behind other sessions of this process."""
        if self.style is Style.PLAIN or not in_line.ahead:
            return ""
        return self._transient_line(in_line_words(in_line))

    def tool_started(self, name: str, arguments: str) -> str:
        if self.style is Style.PLAIN:
            return ""
        name = for_terminal(name)
        room = self.width - len(name) - 4
        shown = for_terminal(short_arguments(arguments, room))
        line = f"{BOLD}• {name}{RESET}{DIM}({shown}){RESET}\n"
        return self._settle_answer() + self._settle_thinking() + self._lasting(line, own_line=True)

    def tool_finished(self, result: str) -> str:
        if self.style is Style.PLAIN:
            return ""
        # The next request's answer starts from nothing.
        self._answer = ""
        line = f"{DIM}  └ {for_terminal(short_result(result, self.width - 4))}{RESET}\n"
        return self._lasting(line, own_line=True)

    # -- the end ---------------------------------------------------------------------------------

    def finished(self, outcome: TurnOutcome) -> TurnEndText:
        err = f"loopd: {for_terminal(outcome.failure)}\n" if outcome.failure is not None else ""
        cut = f"[loopd] {cut_note(outcome.cut_at)}\n" if outcome.cut_at is not None else ""
        if self.style is Style.PLAIN:
            notices = self.notices(outcome.notices)
            if outcome.failure is not None:
                return TurnEndText(notices, err)
            # stdout is the answer alone (data); the cut is said beside it, on stderr
            return TurnEndText(notices + (outcome.answer or "(no answer)") + "\n", cut)
        out = self._settle_thinking() + self._clear()
        if outcome.failure is None:
            out += self._rest_of_answer(outcome.answer or "")
            if not self._answer:
                out += f"{DIM}(the model gave an empty answer){RESET}\n"
        out += self._settle_answer() + self._end_line()
        if cut:
            out += f"{DIM}{cut}{RESET}"
        return TurnEndText(out + self.notices(outcome.notices), err)

    def notices(self, notices: Sequence[str]) -> str:
        """loopd's own lines about the turn, dimmed (plain when piped)."""
        if self.style is Style.PLAIN:
            return "".join(f"[loopd] {notice}\n" for notice in notices)
        lines = "".join(f"[loopd] {for_terminal(notice)}\n" for notice in notices)
        return f"{DIM}{lines}{RESET}" if lines else ""

    def stopped(self) -> str:
        """The turn was cancelled (Ctrl-C)."""
        if self.style is Style.PLAIN:
            return ""
        line = f"{DIM}[stopped: the turn was cancelled, and is recorded as stopped]{RESET}\n"
        out = self._settle_answer() + self._settle_thinking() + self._clear()
        return out + self._end_line() + line

    # -- pieces ----------------------------------------------------------------------------------

    def _thinking(self, status: Status) -> str:
        self._thought, self._thought_tokens = status.text, status.tokens or 0
        if self.show_thinking:
            new = self._thought[self._thought_written :]
            if not new:
                return ""
            out = self._clear()
            if self._thought_written == 0:
                out += self._end_line()
            self._thought_written = len(self._thought)
            self._open = not new.endswith("\n")
            return out + f"{DIM}{for_terminal(new)}{RESET}"
        head = f"thinking ({self._thought_tokens} tokens): "
        return self._transient_line(head + tail(self._thought, self.width - len(head) - 1))

    def _settle_thinking(self) -> str:
        """The thinking of the request, once it is over: its one-line summary (folded), or the
        end of its last line (whole)."""
        if not self._thought:
            return ""
        tokens, thought = self._thought_tokens, self._thought
        self._thought, self._thought_tokens, self._thought_written = "", 0, 0
        if self.show_thinking:
            return self._end_line()
        head = f"thought for {tokens} tokens: "
        line = f"{DIM}{head}{for_terminal(fit(thought, self.width - len(head) - 1))}{RESET}\n"
        return self._lasting(line, own_line=True)

    def _answering(self, text: str) -> str:
        out = self._settle_thinking()
        if not text.startswith(self._answer):
            # Another request's answer (a tool round the view was not told of): a new line.
            out += self._settle_answer() + self._clear() + self._end_line()
            self._answer = ""
        return out + self._rest_of_answer(text)

    def _rest_of_answer(self, text: str) -> str:
        if text.startswith(self._answer):
            new = text[len(self._answer) :]
        else:  # the outcome's answer is not what streamed: write it whole, on its own line
            settled = self._settle_answer()
            new, self._answer = text, ""
            if self._open:
                settled, self._open = settled + "\n", False
            return settled + self._rest_of_answer(text)
        if not new:
            return ""
        self._answer = text
        shown = for_terminal(new)
        out = self._lasting(shown)
        if self.markdown:
            from loopd.terminal import markdown as md  # rich: only where answers are rendered

            self._block, self._block_shown = self._block + new, self._block_shown + shown
            done, rest = md.split_blocks(self._block)
            if done:
                out += self._rendered(done, rest)
        return out

    def _settle_answer(self) -> str:
        """The answer's block being written, rendered (markdown): its end has come."""
        if not self._block:
            return ""
        return self._rendered(self._block, "")

    def _rendered(self, done: str, rest: str) -> str:
        """The raw lines of the current block erased and written again: its complete part
        ``done`` rendered, then ``rest`` raw. A block taller than the screen stays raw: its top
        has scrolled away."""
        from loopd.terminal import markdown as md

        rows = md.screen_rows(self._block_shown, self.width)
        shown_rest = for_terminal(rest)
        self._block, self._block_shown = rest, shown_rest
        if rows >= self.height or not done.strip():
            return ""
        blank = "\n" if done.endswith("\n\n") else ""  # the blank line that ended the block
        out = md.erase_rows(rows) + md.render(done, self.width) + blank + shown_rest
        self._open = bool(shown_rest) and not shown_rest.endswith("\n")
        return out

    def _transient_line(self, words: str) -> str:
        out = self._settle_answer()
        out += self._end_line() if not self._transient else ""
        self._transient = True
        return out + f"{CLEAR_LINE}{DIM}[{for_terminal(fit(words, self.width - 3))}]{RESET}"

    def _lasting(self, text: str, *, own_line: bool = False) -> str:
        settled = self._settle_answer() if own_line else ""
        out = settled + self._clear() + (self._end_line() if own_line else "")
        self._open = not text.endswith("\n")
        return out + text

    def _clear(self) -> str:
        if not self._transient:
            return ""
        self._transient = False
        return CLEAR_LINE

    def _end_line(self) -> str:
        if not self._open:
            return ""
        self._open = False
        return "\n"
