"""loopcommon.capture: one output cap for both daemons' tools, head only or head and tail."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loopcommon.capture import CappedOutput


def test_a_head_only_output_keeps_up_to_the_cap_and_says_when_to_stop() -> None:
    output = CappedOutput(cap=5)
    assert output.add(b"abc")
    assert not output.add(b"defg")
    assert output.text() == "abcde"
    assert output.cut
    assert (output.held, output.total) == (5, 7)


def test_a_character_split_by_the_cap_is_never_an_error() -> None:
    output = CappedOutput(cap=2)
    output.add("é!".encode())
    output.add("é".encode())
    assert output.text() == "é"
    half = CappedOutput(cap=1)
    half.add("é".encode())
    assert half.text() == "\ufffd"


def test_an_unknown_charset_reads_as_utf8() -> None:
    output = CappedOutput(cap=10, encoding="no-such-charset")
    output.add("é".encode())
    assert output.text() == "é"


def test_head_and_tail_are_kept_with_the_middle_counted() -> None:
    output = CappedOutput(10, tail_bytes=5)
    for chunk in (b"abc", b"defgh", b"ijklmnop", b"qrstuvwxyz"):
        assert output.add(chunk)  # a tail is read to the end
    assert output.held == 10
    assert output.cut
    assert output.text() == (
        "abcde\n[output cut: 26 bytes in all; 16 bytes in the middle are not shown]\nvwxyz"
    )


def test_below_the_cap_the_output_is_whole() -> None:
    output = CappedOutput(10, tail_bytes=5)
    output.add(b"hello")
    output.add("!é".encode())
    assert (output.text(), output.cut) == ("hello!é", False)


def test_the_tail_fits_in_the_cap() -> None:
    with pytest.raises(ValueError, match="not within the cap"):
        CappedOutput(4, tail_bytes=5)


@given(
    chunks=st.lists(st.binary(max_size=40), max_size=30),
    cap=st.integers(1, 64),
    tail_share=st.floats(0, 1),
)
def test_the_output_never_holds_more_than_the_cap(
    chunks: list[bytes], cap: int, tail_share: float
) -> None:
    output = CappedOutput(cap, tail_bytes=int(cap * tail_share))
    everything = b""
    for chunk in chunks:
        output.add(chunk)
        everything += chunk
        assert output.held <= cap
    assert output.total == len(everything)
    assert output.cut == (len(everything) > cap)
    if not output.cut:
        assert output.text() == everything.decode("utf-8", errors="replace")
    elif output.tail_bytes:
        assert output.text().endswith(
            everything[-output.tail_bytes :].decode("utf-8", errors="replace")
        )
