"""``typed_keys_unechoed`` on a real pseudo-terminal pair: the echo is off inside and as it was
after, what was typed meanwhile is still there to read, Ctrl-C still makes a signal (and keeps what
was typed), and a pipe is left alone; ``take_typed`` reads the line begun too, and ``split_typed``
parts what was typed."""

from __future__ import annotations

import os
import pty
import select
import termios
from collections.abc import Iterator

import pytest

from loopd.terminal.typeahead import split_typed, take_typed, typed_keys_unechoed


@pytest.fixture
def terminal() -> Iterator[tuple[int, int]]:
    """(the terminal's side, the side a user types into)."""
    typist, tty = pty.openpty()
    try:
        yield tty, typist
    finally:
        os.close(tty)
        os.close(typist)


def _lflag(fd: int) -> int:
    return int(termios.tcgetattr(fd)[3])


def test_the_echo_is_off_inside_and_the_keys_are_kept(terminal: tuple[int, int]) -> None:
    tty, typist = terminal
    before = termios.tcgetattr(tty)
    assert before[3] & termios.ECHO
    with open(tty, closefd=False) as stream, typed_keys_unechoed(stream):
        inside = _lflag(tty)
        os.write(typist, b"first line\n")
        # Read once the terminal has taken the line: by then it would have echoed it.
        assert os.read(tty, 100) == b"first line\n"
        os.set_blocking(typist, False)
        with pytest.raises(BlockingIOError):  # nothing was drawn on the screen
            os.read(typist, 100)
        os.write(typist, b"next line\n")
    assert not inside & (termios.ECHO | termios.ECHONL)
    assert inside & termios.ISIG  # Ctrl-C still stops the turn
    assert inside & termios.NOFLSH  # ... and leaves what was typed
    assert inside & termios.ICANON
    assert termios.tcgetattr(tty) == before
    assert os.read(tty, 100) == b"next line\n"  # typed inside, kept for the next prompt


def test_a_pipe_is_left_alone() -> None:
    read_end, write_end = os.pipe()
    try:
        with open(read_end, closefd=False) as stream, typed_keys_unechoed(stream):
            os.write(write_end, b"x")
        assert os.read(read_end, 1) == b"x"
    finally:
        os.close(read_end)
        os.close(write_end)


def test_take_typed_reads_the_line_begun_and_leaves_the_mode(terminal: tuple[int, int]) -> None:
    tty, typist = terminal
    with open(tty, closefd=False) as stream, typed_keys_unechoed(stream):
        # An edited line, ended: once it can be read, the terminal has taken the erases.
        os.write(typist, b"sent, with a tyoo\x7f\x7fpo\nbegun")
        select.select([tty], [], [], 10)
        inside = termios.tcgetattr(tty)
        typed = take_typed(stream)
        assert termios.tcgetattr(tty) == inside
        assert take_typed(stream) == ""  # read once
    assert typed == "sent, with a typo\nbegun"


def test_split_typed_sends_ended_lines_and_keeps_the_begun_one() -> None:
    assert split_typed("one\n\ntwo\npart") == (["one", "two"], "part")
    assert split_typed("one\n") == (["one"], "")
    # An arrow key's escape sequence is an edit, not text.
    assert split_typed("a\x1b[Ab\x1bOC") == ([], "ab")
