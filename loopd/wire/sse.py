"""Server-sent events, as llama-server writes them: bytes in, items out, no I/O.

The server's dialect is small: every event is one ``data: <payload>`` line followed by a blank
line, a keep-alive ping is the comment line ``:`` followed by a blank line, and nothing else is
framed. A router whose child dies appends plain text (``proxy error: <reason>``) to the body,
possibly without a newline, so every line that is not a field we expect becomes a `SSEForeign`
item for the caller to report instead of being dropped.

Lines end with ``\\n`` or ``\\r\\n``; a lone ``\\r`` is kept as text (the server never sends one).
Several ``data:`` lines before one blank line join with ``\\n``, as the SSE standard says.

What is held for an event not yet ended (the bytes after the last newline, and the data lines
before its blank line) is bounded by ``max_event_bytes`` (``MAX_EVENT_BYTES``, far above any
event the server writes): a line that never ends, or data lines that never meet a blank one, would
otherwise grow with every byte the server sends. Past the bound the decoder gives one
`SSEOverflow` and reads nothing more, so the caller can close the stream.

Speed matters (this runs for every streamed token), so `SSEDecoder` never loops over bytes in
Python: it cuts its buffer at the last newline, decodes that block in one call and splits it with
``str.split``, into payloads directly when the block holds only ``data:`` events (the usual case),
else into lines. Cutting at a newline also makes multi-byte UTF-8 characters safe to split across
chunks, because the byte ``0x0A`` never occurs inside one.
"""

from dataclasses import dataclass
from typing import Final

__all__ = [
    "MAX_EVENT_BYTES",
    "SSEComment",
    "SSEData",
    "SSEDecoder",
    "SSEForeign",
    "SSEItem",
    "SSEOverflow",
]

# The most an unfinished event may hold. The server's largest events (a final chunk with its
# timings, a tool call's arguments in one delta) are kilobytes.
MAX_EVENT_BYTES: Final = 4 * 1024 * 1024
_HEAD_CHARS: Final = 80  # of an overflowing event, kept for the record


@dataclass(frozen=True, slots=True)
class SSEData:
    """The payload of one event: the text after ``data:``, lines joined with ``\\n``."""

    payload: str


@dataclass(frozen=True, slots=True)
class SSEComment:
    """A comment line (the server's keep-alive ping is an empty one); `text` follows the ``:``."""

    text: str


@dataclass(frozen=True, slots=True)
class SSEForeign:
    """A line that is neither data, a comment, nor blank, without its line ending."""

    line: str


@dataclass(frozen=True, slots=True)
class SSEOverflow:
    """The event being read grew past ``limit`` bytes without ending; `head` is how it began.
    Nothing after it is decoded."""

    limit: int
    head: str


SSEItem = SSEData | SSEComment | SSEForeign | SSEOverflow

_DATA_PREFIX = "data: "
_EVENT_SEPARATOR = "\n\ndata: "  # the end of one event and the start of the next
_LF = ord("\n")


class SSEDecoder:
    """Incremental decoder: `feed` chunks as they arrive, then `flush` once at the end.

    Feeding a stream whole or split at any byte offsets gives the same items (up to an
    `SSEOverflow`, which ends what is decoded).
    Undecodable bytes are kept as ``\\xNN`` escapes, so nothing is lost and nothing raises.
    """

    def __init__(self, max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        self.max_event_bytes = max_event_bytes
        self._pending = bytearray()  # bytes after the last newline seen so far
        self._data_lines: list[str] = []  # data lines of the event not yet ended by a blank line
        self._held = 0  # the characters in ``_data_lines``
        self.overflowed = False

    def feed(self, chunk: bytes) -> list[SSEItem]:
        """Add `chunk` and return the items completed by it."""
        if self.overflowed:
            return []
        end = chunk.rfind(b"\n") + 1
        if not end:
            self._pending += chunk
            return self._overflow([]) if self._over() else []
        if self._pending:
            block = bytes(self._pending) + chunk[:end]
            self._pending.clear()
        else:
            block = chunk[:end]
        if end < len(chunk):
            self._pending += chunk[end:]
        items = self._decode(block)
        return self._overflow(items) if self._over() else items

    def _over(self) -> bool:
        return len(self._pending) + self._held > self.max_event_bytes

    def _overflow(self, items: list[SSEItem]) -> list[SSEItem]:
        """The items so far and the overflow; everything held is dropped."""
        held = self._data_lines[0] if self._data_lines else ""
        pending = self._pending[:_HEAD_CHARS].decode("utf-8", "backslashreplace")
        head = ("data: " + held if held else pending)[:_HEAD_CHARS]
        self._pending = bytearray()
        self._data_lines, self._held = [], 0
        self.overflowed = True
        return [*items, SSEOverflow(self.max_event_bytes, head)]

    def flush(self) -> list[SSEItem]:
        """End of stream: the unterminated last line and any unfinished event become items.

        An event cut off before its blank line is still reported (its payload may be complete
        JSON, and a truncated one shows up as malformed upstream), so the caller sees everything
        the server sent.
        """
        if self.overflowed:
            return []
        items = self._decode(bytes(self._pending) + b"\n") if self._pending else []
        self._pending.clear()
        if self._data_lines:
            items.append(SSEData("\n".join(self._data_lines)))
            self._data_lines, self._held = [], 0
        return items

    def _decode(self, block: bytes) -> list[SSEItem]:
        """Items from `block`, which ends with a newline and holds only whole lines."""
        # Fast path for whole single-line data events, all the server sends between pings.
        # It holds when the separators account for every newline inside: then no payload spans
        # lines and no other kind of line is present. (Slicing and indexing here cost less than
        # startswith/endswith, which parse their arguments on every call.)
        if not self._data_lines and block[:6] == b"data: " and block[-2] == _LF:
            text = block[6:-2].decode("utf-8", "backslashreplace")
            if "\r" not in text:
                if "\n" not in text:
                    return [SSEData(text)]  # one event: how a live stream mostly arrives
                payloads = text.split(_EVENT_SEPARATOR)
                if text.count("\n") == 2 * len(payloads) - 2:
                    return list(map(SSEData, payloads))
        text = block.decode("utf-8", "backslashreplace")
        if "\r" in text:
            text = text.replace("\r\n", "\n")
        return self._decode_lines(text)

    def _decode_lines(self, text: str) -> list[SSEItem]:
        """Items from `text`, whole lines each ending with ``\\n``, one at a time."""
        lines = text.split("\n")
        lines.pop()  # the empty string after the final newline
        items: list[SSEItem] = []
        data_lines = self._data_lines
        for line in lines:
            if not line:
                if data_lines:
                    items.append(SSEData("\n".join(data_lines)))
                    data_lines = []
            elif line.startswith(_DATA_PREFIX):
                data_lines.append(line[6:])
            elif line[0] == ":":
                items.append(SSEComment(line[1:]))
            elif line.startswith("data:"):
                data_lines.append(line[5:])  # no space after the colon: the standard allows it
            elif line == "data":
                data_lines.append("")  # a field name alone is a field with an empty value
            else:
                items.append(SSEForeign(line))
        self._data_lines = data_lines
        self._held = sum(map(len, data_lines)) if data_lines else 0
        return items
