"""web_fetch's bounded decoding (pure): what one layer inflates to, and what is refused."""

import re
import zlib

import pytest

from brokerd.tools.inflate import EncodingRefused, content_codings, inflater_for

TEXT = b"the page's text, " * 100


def compressed(data: bytes, wbits: int) -> bytes:
    compressor = zlib.compressobj(9, zlib.DEFLATED, wbits)
    return compressor.compress(data) + compressor.flush()


def inflate_in_chunks(header: str, body: bytes, limit: int, chunk: int = 7) -> bytes:
    inflater = inflater_for(header, limit)
    assert inflater is not None
    return b"".join(inflater.feed(body[i : i + chunk]) for i in range(0, len(body), chunk))


@pytest.mark.parametrize(
    ("header", "wbits"),
    [("gzip", 31), ("x-gzip", 31), ("deflate", 15), ("deflate", -15), ("identity, GZIP", 31)],
    ids=["gzip", "x-gzip", "deflate (zlib)", "deflate (raw)", "identity then gzip"],
)
def test_one_layer_inflates_whole_under_the_limit(header: str, wbits: int) -> None:
    assert inflate_in_chunks(header, compressed(TEXT, wbits), limit=10_000) == TEXT


def test_inflating_stops_at_the_limit() -> None:
    bomb = compressed(bytes(64 * 1024 * 1024), 31)
    assert inflate_in_chunks("gzip", bomb, limit=1000, chunk=4096) == bytes(1000)


def test_a_page_that_is_not_encoded_needs_no_inflater() -> None:
    assert inflater_for("", 10) is None
    assert inflater_for("identity", 10) is None
    assert content_codings(" gzip , br ") == ["gzip", "br"]


@pytest.mark.parametrize(
    ("header", "says"),
    [
        ("gzip, gzip", "encoded 2 times (gzip, gzip)"),
        ("deflate, gzip, gzip", "encoded 3 times"),
        ("br", "encoded with 'br'"),
        ("zstd", "encoded with 'zstd'"),
    ],
)
def test_stacked_or_unknown_codings_are_refused(header: str, says: str) -> None:
    with pytest.raises(EncodingRefused, match=re.escape(says)):
        inflater_for(header, 10)


def test_a_stream_of_another_coding_is_an_error() -> None:
    inflater = inflater_for("gzip", 100)
    assert inflater is not None
    with pytest.raises(zlib.error):
        inflater.feed(b"not gzip at all")
