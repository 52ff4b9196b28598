"""The parser benchmark's plumbing: chunking, agreement, and a table row per parser (no timing
is asserted: these tests never depend on speed)."""

from collections.abc import Sequence

import pytest

from bench.errors import BenchError
from bench.parsers import (
    check_agreement,
    corpus,
    load_streams,
    loopd_payloads,
    measure,
    split_as_sent,
    split_blocks,
)
from bench.sse_reference import ReferenceParser, line_parser_payloads

STREAMS = load_streams()


def test_chunkings_rejoin_to_the_recorded_bytes() -> None:
    for data in STREAMS:
        assert b"".join(split_as_sent(data)) == data
        assert b"".join(split_blocks(data, 4096)) == data
        assert all(chunk.endswith(b"\n\n") for chunk in split_as_sent(data)[:-1])


def test_one_chunk_per_event_as_sent() -> None:
    data = b"data: 1\n\ndata: 2\n\n: ping\n\ndata: [DONE]\n\n"
    assert split_as_sent(data) == [
        b"data: 1\n\n",
        b"data: 2\n\n",
        b": ping\n\n",
        b"data: [DONE]\n\n",
    ]


def test_corpus_counts_data_events() -> None:
    counted = corpus(STREAMS, "as sent", split_as_sent)
    assert counted.events == sum(len(loopd_payloads([data])) for data in STREAMS)
    assert counted.events > 100


def test_a_parser_that_disagrees_is_refused() -> None:
    def drops_last(chunks: Sequence[bytes]) -> list[str]:
        return line_parser_payloads(chunks)[:-1]

    wrong = ReferenceParser("drops [DONE]", drops_last)
    with pytest.raises(BenchError, match="disagree"):
        check_agreement(wrong, [corpus(STREAMS, "as sent", split_as_sent)])


def test_measure_gives_both_levels_both_cuts_and_both_parsers() -> None:
    reference = ReferenceParser("line-by-line parser", line_parser_payloads)
    rows = measure(reference, STREAMS[:1], repeats=2, target_s=0.001)
    assert {(row.level, row.cut) for row in rows} == {
        ("SSE", "as sent"),
        ("SSE", "4 KiB blocks"),
        ("events", "as sent"),
        ("events", "4 KiB blocks"),
    }
    assert len(rows) == 8
    assert all(row.events_per_second.count == 2 for row in rows)
    assert all(row.events_per_second.minimum > 0 for row in rows)
