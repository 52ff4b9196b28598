"""The pure parts of a paste at the prompt, and one terminal at a time on a session."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from loopd.terminal.inuse import SessionInUse, SessionLocks
from loopd.terminal.paste import END, Pastes, is_long, pasted_text, read_paste


def test_a_long_paste_is_one_line_and_comes_back_whole() -> None:
    pastes = Pastes()
    big = "\n".join(f"line {n}" for n in range(15_000))
    assert is_long(big)
    assert not is_long("three\nshort\nlines")
    placeholder = pastes.keep(big)
    assert placeholder == "[pasted 15,000 lines]"
    one_line = "x" * 5000
    assert pastes.keep(one_line) == "[pasted 5,000 characters]"
    other = big.replace("line 1\n", "LINE 1\n", 1)
    assert pastes.keep(other) == "[pasted 15,000 lines #2]"
    assert pastes.expand(f"Read this: {placeholder} and say") == f"Read this: {big} and say"
    assert pastes.holds(placeholder)
    assert not pastes.holds("[pasted 3 lines]")


def test_a_paste_is_text_whatever_its_bytes() -> None:
    assert pasted_text(b"a\r\nb\rc\x1a\x03\xff") == "a\nb\nc\x1a\x03\ufffd"


def test_read_paste_stops_at_its_end_and_keeps_what_follows() -> None:
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, b"pasted\x1a text" + END + b"typed")
        assert read_paste(read_end) == (b"pasted\x1a text", b"typed")
    finally:
        os.close(read_end)
        os.close(write_end)


def test_a_session_is_one_processs_at_a_time(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, pathlib; from loopd.terminal.inuse import SessionLocks; "
            f"SessionLocks(pathlib.Path({str(tmp_path)!r})).take('mm:a b'); "
            "print('held', flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == "held\n"
        locks = SessionLocks(tmp_path)
        locks.take("other")
        with pytest.raises(SessionInUse, match=rf"'mm:a b' is in use .*\(process {holder.pid}\)"):
            locks.take("mm:a b")
        locks.take("other")  # still held: a refused switch keeps the session it had
    finally:
        holder.communicate("", timeout=30)  # the holder ends: the system lets its lock go
    locks.take("mm:a b")
    locks.release()
