"""web_fetch's decoding of a compressed page, bounded by what the output can still take.

web_fetch asks for ``identity``, but a server may send an encoded page anyway, and a page of a
few hundred bytes can inflate to gigabytes (more so with stacked encodings: each layer
multiplies). So the body is read raw and decoded here: one ``gzip`` or ``deflate`` layer at
most (a page encoded twice, or in a coding web_fetch does not decode, is refused), inflated
only up to a limit (zlib's ``max_length``), so that the bytes decoded are never more than the
output cap plus one (which tells the output it was cut).
"""

import zlib
from typing import Final

GZIP: Final = frozenset({"gzip", "x-gzip"})
DEFLATE: Final = frozenset({"deflate"})


class EncodingRefused(ValueError):
    """The page's encoding is one web_fetch does not decode; the message says which."""


def content_codings(header: str) -> list[str]:
    """The codings a ``Content-Encoding`` header names, outermost last (``identity`` left out)."""
    codings = [part.strip().lower() for part in header.split(",")]
    return [coding for coding in codings if coding and coding != "identity"]


class BoundedInflater:
    """Inflates one gzip or deflate stream, at most ``limit`` bytes in all."""

    def __init__(self, coding: str, limit: int) -> None:
        self.coding = coding
        self.left = limit
        # gzip: its header and trailer (16 + MAX_WBITS); deflate: zlib's format, as HTTP names
        # it, with a raw stream (which some servers send) tried when the first bytes fail.
        self._raw_tried = coding in GZIP
        self._inflater = zlib.decompressobj(
            16 + zlib.MAX_WBITS if coding in GZIP else zlib.MAX_WBITS
        )
        self._started = False

    def feed(self, data: bytes) -> bytes:
        """What ``data`` inflates to, up to what is left of the limit; ``zlib.error`` for a
        stream that is not of its coding."""
        if self.left <= 0:
            return b""
        try:
            out = self._inflater.decompress(data, self.left)
        except zlib.error:
            if self._started or self._raw_tried:
                raise
            self._raw_tried = True
            self._inflater = zlib.decompressobj(-zlib.MAX_WBITS)
            out = self._inflater.decompress(data, self.left)
        self._started = True
        self.left -= len(out)
        return out


def inflater_for(header: str, limit: int) -> BoundedInflater | None:
    """The decoder for a page sent under ``Content-Encoding: header`` (None: not encoded);
    ``EncodingRefused`` for a coding web_fetch does not decode or for more than one layer."""
    codings = content_codings(header)
    if not codings:
        return None
    if len(codings) > 1:
        raise EncodingRefused(
            f"the page is encoded {len(codings)} times ({', '.join(codings)}); "
            "web_fetch decodes one gzip or deflate layer at most"
        )
    [coding] = codings
    if coding not in GZIP | DEFLATE:
        raise EncodingRefused(
            f"the page is encoded with {coding!r}; web_fetch decodes only gzip and deflate"
        )
    return BoundedInflater(coding, limit)
