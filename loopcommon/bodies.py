"""Reading an HTTP answer's body within a bound, for the clients that read what a server sends
(loopd's inference and Mattermost clients).

A server decides how much it sends; a client that reads a body whole (httpx's ``aread``, its
``.text``) holds all of it, so an error answer that never ends, or a JSON answer of gigabytes,
takes the client's memory. ``read_at_most`` reads up to a bound and says whether there was more;
the caller then closes the answer unread and says so in one line.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Final, Protocol

ERROR_PREFIX_BYTES: Final = 16 * 1024
"""Of an error answer, what is read before the connection is closed: an error's envelope, or a
proxy's page, is far less."""


class RawBody(Protocol):
    """An answer whose body streams in (an ``httpx.Response`` sent with ``stream=True``)."""

    @property
    def is_stream_consumed(self) -> bool: ...

    @property
    def content(self) -> bytes: ...

    def aiter_raw(self) -> AsyncIterator[bytes]: ...


async def read_at_most(response: RawBody, limit: int) -> tuple[bytes, bool]:
    """The body as sent when it is at most ``limit`` bytes, and False; else its first bytes
    (up to ``ERROR_PREFIX_BYTES``, for the line that says it was too long) and True. The rest
    is not read: the caller closes the answer."""
    if response.is_stream_consumed:  # an answer built whole in memory (a transport's own)
        whole = response.content
        if len(whole) > limit:
            return whole[: min(limit, ERROR_PREFIX_BYTES)], True
        return whole, False
    # Pieces joined once at the end: a growing bytearray over-allocates, and its copy to bytes
    # doubles the peak.
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_raw():
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            return _head(chunks, min(limit, ERROR_PREFIX_BYTES)), True
    return b"".join(chunks), False


def _head(chunks: list[bytes], size: int) -> bytes:
    head = bytearray()
    for chunk in chunks:
        head += chunk[: size - len(head)]
        if len(head) >= size:
            break
    return bytes(head)


def error_text(prefix: bytes, *, cut: bool, chars: int = 300) -> str:
    """An error answer's text for a one-line message: its first ``chars``, and, when the answer
    was longer than what was read, a word saying so."""
    text = prefix.decode("utf-8", "replace").strip()
    line = text[:chars] or "(empty body)"
    if cut:
        line += f" ... (an answer of more than {len(prefix):,} bytes, not read on)"
    return line
