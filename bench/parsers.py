"""Stream-parser throughput: loopd's decoders against the reference parser, on recorded streams.

Every parser gets the same chunks of the same recorded server responses
(``tests/data/streams/*.sse``), cut two ways: as the server sent them (one event per chunk, how a
live stream mostly arrives) and in 4 KiB blocks (how a backlog arrives). Two levels are compared:

- SSE: bytes to event payloads (loopd's ``SSEDecoder`` against the reference);
- events: bytes to parsed chunks (loopd's ``EventDecoder``, which also builds typed events,
  against the reference followed by ``json.loads`` of each payload).

Throughput is counted in SSE events per second. Before timing, every parser must give the same
payloads as loopd on every stream: a comparison of parsers that disagree would mean nothing.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.errors import BenchError
from bench.sse_reference import ReferenceParser
from bench.stats import Spread
from loopd.wire import EventDecoder, SSEData, SSEDecoder

STREAMS = Path(__file__).resolve().parent.parent / "tests" / "data" / "streams"
BLOCK = 4096

Parse = Callable[[Sequence[bytes]], int]  # a response's chunks -> how many events it held


@dataclass(frozen=True)
class Corpus:
    """The recorded streams, each cut into chunks one way."""

    cut: str
    streams: tuple[tuple[bytes, ...], ...]
    events: int  # data events in all streams together


@dataclass(frozen=True)
class ParserRow:
    level: str  # "SSE" or "events"
    cut: str
    parser: str
    events_per_second: Spread


def load_streams(folder: Path = STREAMS) -> list[bytes]:
    streams = [path.read_bytes() for path in sorted(folder.glob("*.sse"))]
    if not streams:
        raise BenchError(f"no recorded streams (*.sse) in {folder}")
    return streams


def split_as_sent(data: bytes) -> list[bytes]:
    """One chunk per event: each ends with the blank line that closes it."""
    pieces = data.split(b"\n\n")
    chunks = [piece + b"\n\n" for piece in pieces[:-1]]
    if pieces[-1]:
        chunks.append(pieces[-1])
    return chunks


def split_blocks(data: bytes, size: int = BLOCK) -> list[bytes]:
    return [data[start : start + size] for start in range(0, len(data), size)]


def loopd_payloads(chunks: Sequence[bytes]) -> list[str]:
    decoder = SSEDecoder()
    items = [item for chunk in chunks for item in decoder.feed(chunk)]
    items.extend(decoder.flush())
    return [item.payload for item in items if isinstance(item, SSEData)]


def corpus(streams: Sequence[bytes], cut: str, splitter: Callable[[bytes], list[bytes]]) -> Corpus:
    chunked = tuple(tuple(splitter(data)) for data in streams)
    events = sum(len(loopd_payloads(chunks)) for chunks in chunked)
    return Corpus(cut, chunked, events)


def check_agreement(reference: ReferenceParser, corpora: Sequence[Corpus]) -> None:
    """Raise unless the reference yields loopd's payloads for every stream and cut."""
    for chunks_of in corpora:
        for index, chunks in enumerate(chunks_of.streams):
            if reference.parse(chunks) != loopd_payloads(chunks):
                raise BenchError(
                    f"{reference.name} and loopd disagree on stream #{index} ({chunks_of.cut}); "
                    "their speeds are not comparable"
                )


def sse_parsers(reference: ReferenceParser) -> dict[str, Parse]:
    return {
        "loopd SSEDecoder": lambda chunks: len(loopd_payloads(chunks)),
        reference.name: lambda chunks: len(reference.parse(chunks)),
    }


def event_parsers(reference: ReferenceParser) -> dict[str, Parse]:
    def loopd_events(chunks: Sequence[bytes]) -> int:
        decoder = EventDecoder()
        for chunk in chunks:
            decoder.feed(chunk)
        decoder.flush()
        return 1

    def reference_events(chunks: Sequence[bytes]) -> int:
        for payload in reference.parse(chunks):
            if payload != "[DONE]":
                json.loads(payload)
        return 1

    return {
        "loopd EventDecoder (typed events)": loopd_events,
        f"{reference.name} + json.loads": reference_events,
    }


def seconds_per_pass(parse: Parse, chunks_of: Corpus) -> float:
    started = time.perf_counter()
    for chunks in chunks_of.streams:
        parse(chunks)
    return time.perf_counter() - started


def rounds_for(parse: Parse, chunks_of: Corpus, target_s: float) -> int:
    """How many passes over the corpus make one timed run last about ``target_s``."""
    one = max(seconds_per_pass(parse, chunks_of), 1e-6)
    return max(int(target_s / one), 1)


def events_per_second(parse: Parse, chunks_of: Corpus, repeats: int, target_s: float) -> Spread:
    rounds = rounds_for(parse, chunks_of, target_s)
    rates = []
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(rounds):
            for chunks in chunks_of.streams:
                parse(chunks)
        rates.append(chunks_of.events * rounds / (time.perf_counter() - started))
    return Spread.of(rates)


def measure(
    reference: ReferenceParser,
    streams: Sequence[bytes],
    *,
    repeats: int = 5,
    target_s: float = 0.3,
) -> list[ParserRow]:
    corpora = [
        corpus(streams, "as sent", split_as_sent),
        corpus(streams, f"{BLOCK // 1024} KiB blocks", split_blocks),
    ]
    check_agreement(reference, corpora)
    rows = []
    for level, parsers in (("SSE", sse_parsers(reference)), ("events", event_parsers(reference))):
        for chunks_of in corpora:
            for name, parse in parsers.items():
                rate = events_per_second(parse, chunks_of, repeats, target_s)
                rows.append(ParserRow(level, chunks_of.cut, name, rate))
    return rows
