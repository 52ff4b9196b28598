"""The reference parsers give loopd's payloads on the same bytes, however they are cut."""

import pytest

from bench.parsers import load_streams, loopd_payloads, split_as_sent, split_blocks
from bench.sse_reference import (
    LineSSEParser,
    library_parser,
    line_parser_payloads,
    reference_parser,
)

STREAMS = load_streams()


@pytest.mark.parametrize("index", range(len(STREAMS)))
def test_line_parser_agrees_with_loopd_on_recorded_streams(index: int) -> None:
    data = STREAMS[index]
    expected = loopd_payloads([data])
    assert expected[-1] == "[DONE]"
    for chunks in ([data], split_as_sent(data), split_blocks(data, 64), split_blocks(data, 1)):
        assert line_parser_payloads(chunks) == expected


def test_line_parser_keeps_multibyte_characters_split_across_chunks() -> None:
    data = 'data: {"content":"été ✓"}\n\n'.encode()
    cut = data.index("✓".encode()) + 1  # inside the three bytes of the check mark
    assert line_parser_payloads([data[:cut], data[cut:]]) == ['{"content":"été ✓"}']


def test_line_parser_handles_crlf_comments_and_multiline_data() -> None:
    parser = LineSSEParser()
    got = parser.feed(b": ping\r\n\r\ndata: a\r\ndata:b\r\n\r\nevent: x\n")
    assert got == ["a\nb"]
    assert parser.feed(b"data: tail") == []
    assert parser.flush() == ["tail"]


def test_the_reference_is_the_library_when_installed_else_the_line_parser() -> None:
    library = library_parser()
    chosen = reference_parser()
    if library is None:
        assert chosen.name == "line-by-line parser"
    else:
        assert chosen.name.startswith("httpx-sse")
        assert chosen.parse(split_as_sent(STREAMS[0])) == loopd_payloads([STREAMS[0]])
