"""An answer's Markdown on a terminal (``loopd.terminal.markdown`` and ``TurnView(markdown=True)``):
blocks cut where they end, the rows they take, the rendering, and model text never obeyed."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from loopd.engine.outcome import TurnOutcome
from loopd.engine.progress import Phase, Status
from loopd.terminal.markdown import erase_rows, render, screen_rows, split_blocks
from loopd.terminal.render import Style, TurnView
from tests.terminal.support import emulated, plain

ANSWER = "## Plan\n\n- read the file\n- fix the bug\n\nThen **run** the `tests`."


def test_blocks_end_at_a_blank_line_outside_a_code_fence() -> None:
    assert split_blocks("one\n\ntwo") == ("one\n\n", "two")
    assert split_blocks("one\n\n\ntwo\n") == ("one\n\n\n", "two\n")
    assert split_blocks("one\ntwo") == ("", "one\ntwo")
    assert split_blocks("one\n") == ("", "one\n")
    assert split_blocks("one\n  ") == ("", "one\n  ")  # the blank line is not complete yet
    fenced = "```py\nx = 1\n\ny = 2\n```\n\nafter"
    assert split_blocks(fenced) == (fenced.removesuffix("after"), "after")
    assert split_blocks("```\nopen\n\nstill") == ("", "```\nopen\n\nstill")


def test_the_rows_text_takes_count_wrapping_and_wide_characters() -> None:
    assert screen_rows("", 20) == 1
    assert screen_rows("abc", 20) == 1
    assert screen_rows("abc\n", 20) == 2  # the cursor is on the next row
    assert screen_rows("x" * 20, 20) == 1  # exactly the width: no wrap yet
    assert screen_rows("x" * 21, 20) == 2
    assert screen_rows("語" * 11, 20) == 2  # two cells each
    assert screen_rows("a\tb", 5) == 2  # the tab goes to column 8
    assert erase_rows(1) == "\r\x1b[J"
    assert erase_rows(3) == "\r\x1b[2A\x1b[J"


def _screen(written: str, columns: int = 60, lines: int = 24) -> list[str]:
    return emulated(written.replace("\n", "\r\n"), columns, lines)  # as a tty's onlcr writes it


def test_markdown_is_rendered_and_rich_markup_is_not() -> None:
    shown = render(ANSWER, 60)
    assert "##" not in shown
    assert "• read the file" in plain(shown)
    assert "**" not in shown
    assert "\x1b[1mrun\x1b[0m" in shown  # bold
    assert not shown.startswith("\n")
    assert "`" not in shown  # the code span is styled, not back-quoted
    assert " \n" not in plain(shown)  # no padding to the width
    markup = render("[bold]x[/bold] [link=https://evil.example]click[/link] :smile:", 100)
    assert plain(markup) == "[bold]x[/bold] [link=https://evil.example]click[/link] :smile:\n"


def test_control_characters_from_the_model_are_shown_never_sent() -> None:
    hostile = (
        "a \x1b]0;title\x07 b \x1b[2J c \x9b31m d &#x1b;[31m e &#x202e;f [go](https://x.example)"
    )
    shown = render(hostile, 100)
    escapes = [part.split("m", 1)[0] for part in shown.split("\x1b[")[1:]]
    assert all(code.replace(";", "").isdigit() for code in escapes), shown  # SGR colours only
    assert "\x1b]" not in shown  # no OSC: no title, no hyperlink
    assert "\x07" not in shown
    assert "\x9b" not in shown
    assert "\u202e" not in shown
    assert "␛]0;title␇" in shown
    assert "<U+009B>31m" in shown
    assert "https://x.example" in plain(shown)  # a link's address is shown as text


@given(st.text(max_size=200))
def test_no_model_text_reaches_the_terminal_as_a_control(text: str) -> None:
    shown = render(text, 40)
    without_sgr = plain(shown)
    assert not any(ord(c) < 0x20 and c not in "\n\t" for c in without_sgr)
    assert not any(0x7F <= ord(c) <= 0x9F for c in without_sgr)


def _streamed(view: TurnView, answer: str, step: int = 3) -> str:
    out = "".join(
        view.status(Status(Phase.ANSWERING, text=answer[:end]))
        for end in range(1, len(answer) + 1, step)
    )
    return out + view.finished(TurnOutcome(answer=answer)).out


def test_each_block_streams_raw_then_is_drawn_again_rendered() -> None:
    first = TurnView(Style.TERMINAL, markdown=True).status(Status(Phase.ANSWERING, text="## Pl"))
    assert first.endswith("## Pl")  # raw at once
    view = TurnView(Style.TERMINAL, width=60, markdown=True)
    assert _screen(_streamed(view, ANSWER))[:6] == [
        "Plan",
        "",
        " • read the file",
        " • fix the bug",
        "",
        "Then run the tests.",
    ]


def test_a_block_taller_than_the_screen_stays_raw() -> None:
    long_block = "\n".join(f"- item {n}" for n in range(30)) + "\n\n## After"
    view = TurnView(Style.TERMINAL, width=60, height=24, markdown=True)
    lines = _screen(_streamed(view, long_block), lines=40)
    assert lines[0] == "- item 0"  # raw: its top had scrolled away
    assert lines[31] == "After"  # the next block, short, is rendered


def test_without_markdown_and_in_plain_style_the_answer_is_as_written() -> None:
    assert _screen(_streamed(TurnView(Style.TERMINAL, width=60), ANSWER))[0] == "## Plan"
    plain_view = TurnView(Style.PLAIN, markdown=True)
    assert _streamed(plain_view, ANSWER) == ANSWER + "\n"
