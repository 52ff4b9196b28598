"""The parsers loopd's stream parser is compared with, on the same bytes.

- ``httpx-sse``, a widely used client library's SSE parser, when it is installed: its
  ``EventSource`` over an ``httpx.Response`` whose body is the recorded chunks, so the library's
  whole path runs (httpx's byte, text and line decoders, then its event decoder).
- Otherwise a line-by-line parser written the way such code is commonly written: an incremental
  UTF-8 decoder, a text buffer cut at each newline, data lines collected until a blank line.

Each is a function from a response's chunks to the payloads of its ``data`` events.
"""

from __future__ import annotations

import codecs
import importlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol, cast

import httpx

REFERENCE_LIBRARY = "httpx-sse"
_LIBRARY_MODULE = "httpx_sse"

PayloadParser = Callable[[Sequence[bytes]], list[str]]


@dataclass(frozen=True)
class ReferenceParser:
    name: str
    parse: PayloadParser


class LineSSEParser:
    """SSE the common way: decode, buffer, split at newlines, join data lines at a blank line."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._buffer = ""
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[str]:
        self._buffer += self._decoder.decode(chunk)
        payloads: list[str] = []
        while "\n" in self._buffer:
            line, self._buffer = self._buffer.split("\n", 1)
            self._line(line.rstrip("\r"), payloads)
        return payloads

    def flush(self) -> list[str]:
        self._buffer += self._decoder.decode(b"", final=True)
        payloads: list[str] = []
        if self._buffer:
            self._line(self._buffer.rstrip("\r"), payloads)
            self._buffer = ""
        self._line("", payloads)
        return payloads

    def _line(self, line: str, payloads: list[str]) -> None:
        if not line:
            if self._data:
                payloads.append("\n".join(self._data))
                self._data = []
        elif line.startswith("data:"):
            value = line[5:]
            self._data.append(value[1:] if value.startswith(" ") else value)
        # Comments (``:``) and other fields carry nothing a chat client uses.


def line_parser_payloads(chunks: Sequence[bytes]) -> list[str]:
    parser = LineSSEParser()
    payloads: list[str] = []
    for chunk in chunks:
        payloads.extend(parser.feed(chunk))
    payloads.extend(parser.flush())
    return payloads


class _ServerSentEvent(Protocol):
    @property
    def data(self) -> str: ...


class _EventSource(Protocol):
    def iter_sse(self) -> Iterator[_ServerSentEvent]: ...


class _ChunkStream(httpx.SyncByteStream):
    """A response body that yields the given chunks, as a socket would deliver them."""

    def __init__(self, chunks: Sequence[bytes]) -> None:
        self._chunks = chunks

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._chunks)


def library_parser() -> ReferenceParser | None:
    """The library's parser, or None when it is not installed."""
    try:
        module = importlib.import_module(_LIBRARY_MODULE)
    except ImportError:
        return None
    event_source = cast(Callable[[httpx.Response], _EventSource], module.EventSource)

    def parse(chunks: Sequence[bytes]) -> list[str]:
        response = httpx.Response(
            200, headers={"content-type": "text/event-stream"}, stream=_ChunkStream(chunks)
        )
        return [event.data for event in event_source(response).iter_sse()]

    version = getattr(module, "__version__", "")
    return ReferenceParser(f"{REFERENCE_LIBRARY} {version}".strip(), parse)


def reference_parser() -> ReferenceParser:
    """The library's parser when installed, else the common line-by-line one."""
    return library_parser() or ReferenceParser("line-by-line parser", line_parser_payloads)
