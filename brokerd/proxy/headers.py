"""Pure filters for what crosses the proxies: headers and query strings.

ASGI hands headers over as raw ``(name, value)`` byte pairs and httpx accepts the same shape, so
headers stay bytes end to end: nothing is decoded, re-encoded or reordered on the way through.
"""

from collections.abc import Iterable, Mapping
from urllib.parse import unquote_plus

RawHeaders = list[tuple[bytes, bytes]]

# RFC 9110 section 7.6.1: these describe one connection, never the message, so a proxy drops them.
HOP_BY_HOP: frozenset[bytes] = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)

# Recomputed or meaningless once the proxy has the whole body in hand and its own upstream URL.
REQUEST_FRAMING: frozenset[bytes] = frozenset({b"host", b"content-length", b"expect"})

# What a client behind a proxy could use to claim another address, host, scheme, URL or method:
# an upstream (or a proxy in front of it) may trust these, so nothing from the box carries them.
FORWARDING_HEADERS: frozenset[bytes] = frozenset(
    {
        b"forwarded",
        b"x-forwarded-for",
        b"x-forwarded-host",
        b"x-forwarded-proto",
        b"x-forwarded-port",
        b"x-forwarded-prefix",
        b"x-forwarded-server",
        b"x-real-ip",
        b"x-client-ip",
        b"true-client-ip",
        b"x-original-url",
        b"x-rewrite-url",
        b"x-original-method",
        b"x-http-method-override",
        b"x-http-method",
        b"x-method-override",
    }
)


def _named_by_connection(headers: Iterable[tuple[bytes, bytes]]) -> set[bytes]:
    """Header names that a ``Connection`` header declares hop-by-hop for this one message."""
    named: set[bytes] = set()
    for name, value in headers:
        if name.lower() == b"connection":
            named.update(token.strip().lower() for token in value.split(b",") if token.strip())
    return named


def filter_headers(
    headers: Iterable[tuple[bytes, bytes]],
    *,
    drop: frozenset[bytes],
    inject: Mapping[bytes, bytes] | None = None,
) -> RawHeaders:
    """Drop hop-by-hop headers and the names in ``drop`` (lower case), then append ``inject``.

    Injected names are also removed from the input first, so a value the caller sends can never
    sit next to (or shadow) the one the proxy adds.
    """
    pairs = list(headers)
    injected = dict(inject or {})
    removed = HOP_BY_HOP | drop | _named_by_connection(pairs) | frozenset(injected)
    kept = [(name, value) for name, value in pairs if name.lower() not in removed]
    kept.extend(injected.items())
    return kept


def query_keys(query: bytes) -> set[str]:
    """The decoded parameter names of a raw query string (``a=1&b&c=`` gives a, b, c)."""
    return {_decoded_key(part) for part in query.split(b"&") if part}


def drop_query_params(query: bytes, names: frozenset[str]) -> bytes:
    """The raw query string without the parameters called ``names``; the rest byte for byte."""
    return b"&".join(part for part in query.split(b"&") if part and _decoded_key(part) not in names)


def _decoded_key(part: bytes) -> str:
    return unquote_plus(part.split(b"=", 1)[0].decode("latin-1"))
