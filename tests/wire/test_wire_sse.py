"""SSEDecoder: framing, line endings, comments, foreign lines, and chunks split anywhere."""

from itertools import pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loopd.wire.sse import SSEComment, SSEData, SSEDecoder, SSEForeign, SSEItem, SSEOverflow


def decode_whole(body: bytes) -> list[SSEItem]:
    decoder = SSEDecoder()
    return decoder.feed(body) + decoder.flush()


def decode_chunks(chunks: list[bytes]) -> list[SSEItem]:
    decoder = SSEDecoder()
    items: list[SSEItem] = []
    for chunk in chunks:
        items.extend(decoder.feed(chunk))
    return items + decoder.flush()


def split_at(body: bytes, offsets: list[int]) -> list[bytes]:
    bounds = [0, *sorted(offsets), len(body)]
    return [body[start:end] for start, end in pairwise(bounds)]


def test_data_events_are_separated_by_blank_lines() -> None:
    body = b'data: {"a":1}\n\ndata: {"b":2}\n\ndata: [DONE]\n\n'
    assert decode_whole(body) == [SSEData('{"a":1}'), SSEData('{"b":2}'), SSEData("[DONE]")]


def test_an_event_is_returned_by_the_feed_that_completes_it() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: x\n") == []
    assert decoder.feed(b"\ndata: y") == [SSEData("x")]
    assert decoder.feed(b"\n\n") == [SSEData("y")]
    assert decoder.flush() == []


def test_crlf_line_endings() -> None:
    body = b"data: one\r\n\r\n:\r\n\r\ndata: two\r\n\r\n"
    assert decode_whole(body) == [SSEData("one"), SSEComment(""), SSEData("two")]


def test_crlf_split_between_cr_and_lf() -> None:
    assert decode_chunks([b"data: one\r", b"\n\r", b"\n"]) == [SSEData("one")]


def test_lone_cr_is_kept_as_text() -> None:
    assert decode_whole(b"data: a\rb\n\n") == [SSEData("a\rb")]


def test_ping_is_a_comment_and_comment_text_is_kept() -> None:
    body = b":\n\ndata: x\n\n: keep-alive\n\n"
    assert decode_whole(body) == [SSEComment(""), SSEData("x"), SSEComment(" keep-alive")]


def test_foreign_line_after_events_is_reported_without_a_newline() -> None:
    body = b"data: x\n\nproxy error: connection reset by peer"
    assert decode_whole(body) == [SSEData("x"), SSEForeign("proxy error: connection reset by peer")]


def test_foreign_line_with_newline_comes_out_before_flush() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"proxy error: child exited\n") == [SSEForeign("proxy error: child exited")]
    assert decoder.flush() == []


@pytest.mark.parametrize("line", [b"event: message", b"id: 7", b"retry: 10", b"hello"])
def test_fields_the_server_never_sends_are_foreign(line: bytes) -> None:
    assert decode_whole(line + b"\ndata: x\n\n") == [SSEForeign(line.decode()), SSEData("x")]


def test_data_lines_of_one_event_join_with_newline() -> None:
    assert decode_whole(b"data: a\ndata: b\n\n") == [SSEData("a\nb")]


def test_data_without_space_and_bare_data_field() -> None:
    assert decode_whole(b"data:x\n\ndata\n\ndata: \n\n") == [
        SSEData("x"),
        SSEData(""),
        SSEData(""),
    ]


def test_only_the_first_space_after_the_colon_is_dropped() -> None:
    assert decode_whole(b"data:  two spaces\n\n") == [SSEData(" two spaces")]


def test_blank_lines_without_data_give_nothing() -> None:
    assert decode_whole(b"\n\n\n\r\n") == []


def test_unterminated_event_is_reported_at_flush() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b'data: {"a":1}\n') == []
    assert decoder.flush() == [SSEData('{"a":1}')]


def test_unterminated_line_is_reported_at_flush() -> None:
    assert decode_whole(b"data: [DONE]") == [SSEData("[DONE]")]


def test_flush_resets_the_decoder() -> None:
    decoder = SSEDecoder()
    decoder.feed(b"data: a\ndata: b")
    assert decoder.flush() == [SSEData("a\nb")]
    assert decoder.flush() == []
    assert decoder.feed(b"data: c\n\n") == [SSEData("c")]


def test_invalid_utf8_is_kept_as_escapes() -> None:
    assert decode_whole(b"data: a\xffb\n\n\xfe\n") == [SSEData("a\\xffb"), SSEForeign("\\xfe")]


def test_line_separators_other_than_newline_stay_in_the_payload() -> None:
    payload = "a\u2028b\u0085c\x0bd\x0ce\x1cf"
    assert decode_whole(f"data: {payload}\n\n".encode()) == [SSEData(payload)]


UNICODE_TEXTS = [
    "🦙 emoji 👩‍👩‍👧 with a joiner",
    "中文字符と日本語",
    "combining: e\u0301 a\u0308 \u0915\u094d\u0937",
    "mixed 𝄞 ✓ ü",
]


@pytest.mark.parametrize("text", UNICODE_TEXTS)
def test_multibyte_characters_split_at_every_byte(text: str) -> None:
    body = f'data: {{"t":"{text}"}}\n\n:\n\nforeign {text}\n'.encode()
    expected = [SSEData(f'{{"t":"{text}"}}'), SSEComment(""), SSEForeign(f"foreign {text}")]
    assert decode_whole(body) == expected
    for offset in range(len(body) + 1):
        assert decode_chunks(split_at(body, [offset])) == expected, offset
    assert decode_chunks([body[i : i + 1] for i in range(len(body))]) == expected


PIECES = [
    b'data: {"choices":[]}\n\n',
    b"data: caf\xc3\xa9 \xf0\x9f\xa6\x99 \xe4\xb8\xad\n\n",
    b"data: a\r\ndata: b\r\n\r\n",
    b":\n\n",
    b": comment\r\n",
    b"\n",
    b"\r\n",
    b"data:x\n",
    b"proxy error: boom\n",
    b"event: e\n",
    b"data: [DONE]\n\n",
    b"\xff\xfe",
    b"data: no end",
    b"\r",
]


@given(
    pieces=st.lists(st.sampled_from(PIECES), max_size=12),
    offsets=st.lists(st.integers(min_value=0, max_value=400), max_size=8),
)
def test_any_chunking_gives_the_same_items(pieces: list[bytes], offsets: list[int]) -> None:
    body = b"".join(pieces)
    offsets = [offset for offset in offsets if offset <= len(body)]
    assert decode_chunks(split_at(body, offsets)) == decode_whole(body)


@given(body=st.binary(max_size=200), offsets=st.lists(st.integers(0, 200), max_size=6))
def test_arbitrary_bytes_never_raise_and_split_the_same(body: bytes, offsets: list[int]) -> None:
    offsets = [offset for offset in offsets if offset <= len(body)]
    assert decode_chunks(split_at(body, offsets)) == decode_whole(body)


@pytest.mark.parametrize(
    ("body", "items"),
    [
        (b"data: a\r\n\ndata: b\n\n", [SSEData("a"), SSEData("b")]),
        (b"data: a\n\ndata: b\ndata: c\n\n", [SSEData("a"), SSEData("b\nc")]),
        (b"data: a\n\n\n", [SSEData("a")]),
        (b"data: a\n\n:\n\n", [SSEData("a"), SSEComment("")]),
        (b"data: a\n\nhello\n\n", [SSEData("a"), SSEForeign("hello")]),
        (b"data: \n\n", [SSEData("")]),
    ],
)
def test_blocks_that_look_like_data_events_but_are_not_only_that(
    body: bytes, items: list[SSEItem]
) -> None:
    # Each body starts with "data: " and ends with a blank line, the shape the fast path takes.
    assert decode_whole(body) == items


BOUND = 64


@pytest.mark.parametrize(
    "body",
    [
        b"data: " + b"x" * 100,  # a line that never ends
        b"data: abcdefgh\n" * 20,  # data lines without the blank line that ends their event
        b"\n".join([b"data: ok", b"", b"data: " + b"y" * 100]),  # past the bound after an event
    ],
)
@given(offsets=st.lists(st.integers(0, 220), max_size=6))
def test_an_event_past_the_bound_overflows_once_at_any_split(
    body: bytes, offsets: list[int]
) -> None:
    decoder = SSEDecoder(max_event_bytes=BOUND)
    items = [item for piece in split_at(body, offsets) for item in decoder.feed(piece)]
    items += decoder.feed(b"\n\ndata: after\n\n") + decoder.flush()
    overflows = [item for item in items if isinstance(item, SSEOverflow)]
    assert len(overflows) == 1
    assert items[-1] == overflows[0]  # nothing after it: the stream is not read on
    assert overflows[0].limit == BOUND
    assert len(overflows[0].head) <= 80
    assert all(isinstance(item, SSEData) and item.payload == "ok" for item in items[:-1])


def test_an_event_within_the_bound_is_whole() -> None:
    decoder = SSEDecoder(max_event_bytes=BOUND)
    payload = "z" * (BOUND - len("data: "))
    assert decoder.feed(f"data: {payload}".encode()) == []
    assert decoder.feed(b"\n\n") == [SSEData(payload)]
    assert not decoder.overflowed
