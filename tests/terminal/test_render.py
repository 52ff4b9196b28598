"""The terminal's rendering of a turn (``loopd.terminal.render``), fed statuses and tool events."""

from __future__ import annotations

import unicodedata

from hypothesis import given
from hypothesis import strategies as st

from loopcommon.sanitize import for_terminal
from loopd.engine.outcome import TurnOutcome
from loopd.engine.progress import Phase, Status
from loopd.terminal.render import (
    CLEAR_LINE,
    Style,
    TurnView,
    fit,
    short_arguments,
    short_result,
    tail,
)
from tests.terminal.support import plain


def answering(text: str) -> Status:
    return Status(Phase.ANSWERING, text=text)


def thinking(text: str) -> Status:
    return Status(Phase.THINKING, tokens=len(text.split()), text=text)


def test_the_answer_is_written_as_it_grows_and_ends_with_a_newline() -> None:
    view = TurnView(Style.TERMINAL)
    status = view.status(Status(Phase.READING, percent=40))
    assert "reading the prompt 40%" in status
    first = view.status(answering("Hello"))
    assert first == CLEAR_LINE + "Hello"  # the status line erased, then the text
    assert view.status(answering("Hello, world")) == ", world"
    assert view.status(answering("Hello, world")) == ""
    end = view.finished(TurnOutcome(answer="Hello, world."))
    assert end.out == ".\n"
    assert end.err == ""


def test_folded_thinking_is_one_transient_line_then_a_one_line_summary() -> None:
    view = TurnView(Style.TERMINAL, width=60)
    shown = view.status(thinking("First I look.\nThen I answer."))
    assert shown.startswith(CLEAR_LINE)
    assert "\n" not in shown.removeprefix(CLEAR_LINE)
    assert "First I look. Then I answer." in plain(shown)
    longer = view.status(thinking("First I look.\nThen I answer.\n" + "More words. " * 20))
    assert len(plain(longer).removeprefix(CLEAR_LINE)) <= 60
    answer = plain(view.status(answering("Yes.")))
    summary, rest = answer.removeprefix(CLEAR_LINE).split("\n", 1)
    assert summary.startswith("thought for ")
    assert summary.count("First I look. Then I answer.") == 1
    assert len(summary) <= 60
    assert rest == "Yes."


def test_show_thinking_writes_it_whole_then_the_answer_on_its_own_line() -> None:
    view = TurnView(Style.TERMINAL, show_thinking=True)
    out = view.status(thinking("First I look."))
    out += view.status(thinking("First I look.\nThen I answer."))
    out += view.status(answering("Yes."))
    out += view.finished(TurnOutcome(answer="Yes.")).out
    assert plain(out) == "First I look.\nThen I answer.\nYes.\n"


def test_a_tool_call_gets_a_line_and_its_result_another_between_two_answers() -> None:
    view = TurnView(Style.TERMINAL, width=80)
    out = view.status(answering("Let me look."))
    out += view.status(Status(Phase.TOOL_CALL, tool="list_dir"))
    out += view.tool_started("list_dir", '{"path": "docs"}')
    out += view.tool_finished("a.md\nb.md\nc.md\n")
    out += view.status(Status(Phase.READING, percent=100))
    out += view.status(answering("Three files."))
    out += view.finished(TurnOutcome(answer="Three files.")).out
    lines = [line.removeprefix("\r\x1b[2K") for line in plain(out).split("\n")]
    assert lines[0] == "Let me look."
    assert lines[1].endswith('• list_dir(path="docs")')
    assert lines[2] == "  └ a.md (+2 lines)"
    assert lines[3].endswith("Three files.")
    assert lines[4] == ""


def test_a_failure_goes_to_stderr_and_notices_follow_the_answer() -> None:
    view = TurnView(Style.TERMINAL)
    view.status(answering("Half an"))
    failed = view.finished(TurnOutcome(answer=None, failure="the server went away"))
    assert failed.err == "loopd: the server went away\n"
    assert failed.out == "\n"  # the half answer's line is ended
    view = TurnView(Style.TERMINAL)
    done = view.finished(TurnOutcome(answer="Hi.", notices=["compacted"]))
    assert plain(done.out) == "Hi.\n[loopd] compacted\n"


def test_plain_style_writes_nothing_during_the_turn_and_the_answer_at_its_end() -> None:
    view = TurnView(Style.PLAIN)
    assert view.status(answering("Hel")) == ""
    assert view.status(thinking("hmm")) == ""
    assert view.tool_started("list_dir", "{}") == ""
    assert view.tool_finished("x") == ""
    assert view.stopped() == ""
    assert view.finished(TurnOutcome(answer="Hello.", notices=["n"])).out == "[loopd] n\nHello.\n"
    failed = view.finished(TurnOutcome(answer=None, failure="boom"))
    assert (failed.out, failed.err) == ("", "loopd: boom\n")


def test_stopped_ends_the_open_line_and_says_so() -> None:
    view = TurnView(Style.TERMINAL)
    view.status(answering("Once upon"))
    assert plain(view.stopped()).startswith("\n[stopped")


def test_an_empty_answer_says_so() -> None:
    assert "empty answer" in TurnView(Style.TERMINAL).finished(TurnOutcome(answer="")).out


def test_short_forms() -> None:
    assert fit("a  b\nc", 10) == "a b c"
    assert fit("abcdefghij", 5) == "abcd…"
    assert tail("abcdefghij", 5) == "…ghij"
    assert short_arguments('{"path": "x", "n": 3}', 80) == 'path="x", n=3'
    assert short_arguments('{"content": "' + "y" * 100 + '"}', 80).endswith("…")
    assert short_arguments("not json", 80) == "not json"
    assert short_result("", 80) == "(empty)"
    assert short_result("one\n\ntwo\n", 80) == "one (+1 lines)"


def test_for_terminal_shows_controls_and_keeps_text() -> None:
    assert for_terminal("a\tb\r\nc") == "a\tb\nc"
    assert for_terminal("\x1b]0;t\x07\x9b2J\x7f\u202ex\rz") == "␛]0;t␇<U+009B>2J␡<U+202E>x␍z"
    # Emoji sequences (zero-width joiners) and other scripts stay as written.
    assert for_terminal("👩‍💻 café ここ") == "👩‍💻 café ここ"


@given(st.text())
def test_for_terminal_leaves_no_control_character(text: str) -> None:
    shown = for_terminal(text)
    assert all(
        char in "\n\t" or (unicodedata.category(char) != "Cc" and char not in "\u202a\u202e")
        for char in shown
    )
