"""Where a proxy forwards to: an HTTP(S) origin, or a Unix socket spoken to as plain HTTP."""

from dataclasses import dataclass
from http.cookiejar import CookieJar, DefaultCookiePolicy
from typing import Final
from urllib.parse import urlsplit

import httpx

from brokerd.proxy.oneshot import OneShotTransport
from loopcommon.transport import AsyncioTransport

UNIX_PREFIX: Final = "unix:"
# The Host a Unix-socket upstream sees; it has no name of its own.
UNIX_ORIGIN: Final = "http://localhost"

# A queued request may wait minutes for its first byte and a long generation streams for longer,
# so reads have no deadline here: the client (loopd) owns those limits and hangs up when they pass,
# which closes the upstream request too. Connecting and writing are bounded.
UPSTREAM_TIMEOUT: Final = httpx.Timeout(connect=10.0, read=None, write=60.0, pool=None)

# httpx's own defaults for its pool.
MAX_CONNECTIONS: Final = 100
MAX_IDLE_CONNECTIONS: Final = 20


class BadUpstreamURL(ValueError):
    """An upstream URL that is not ``http://``, ``https://`` or ``unix:/absolute/path``."""


@dataclass(frozen=True)
class Upstream:
    """A parsed upstream. ``origin`` has no trailing slash; ``uds`` is set for a Unix socket."""

    origin: str
    uds: str | None = None

    def url(self, path: str, query: bytes) -> httpx.URL:
        """The upstream URL for a request path (already checked) and its raw query string."""
        return httpx.URL(self.origin + path, query=query)

    def websocket_url(self, path: str, query: bytes) -> str:
        """The same, with the WebSocket scheme that matches the origin's."""
        scheme, rest = self.origin.split("://", 1)
        ws_scheme = "wss" if scheme == "https" else "ws"
        suffix = "?" + query.decode("latin-1") if query else ""
        return f"{ws_scheme}://{rest}{path}{suffix}"

    def client(
        self, timeout: httpx.Timeout = UPSTREAM_TIMEOUT, *, reuse_connections: bool = True
    ) -> httpx.AsyncClient:
        """An httpx client bound to this upstream's transport (TCP/TLS or the Unix socket).

        ``reuse_connections=False`` opens a fresh connection for every request and closes it after
        its answer (see ``create_inference_app`` for why the inference proxy wants that), read
        with httptools (``brokerd.proxy.oneshot``); otherwise httpx's pool, on asyncio's sockets.
        """
        transport: httpx.AsyncBaseTransport
        if reuse_connections:
            # asyncio's own sockets: a read is cheaper than on anyio's (loopcommon.transport).
            limits = httpx.Limits(
                max_connections=MAX_CONNECTIONS, max_keepalive_connections=MAX_IDLE_CONNECTIONS
            )
            transport = AsyncioTransport(uds=self.uds, limits=limits, trust_env=False)
        else:
            transport = OneShotTransport(uds=self.uds)
        # trust_env off: a proxy variable in brokerd's environment must not reroute the traffic.
        return httpx.AsyncClient(
            transport=transport, timeout=timeout, trust_env=False, cookies=no_cookie_jar()
        )


def no_cookie_jar() -> CookieJar:
    """A jar that keeps nothing: a cookie the upstream sets (Mattermost's ``MMAUTHTOKEN``) must
    never be sent again with a later request, which would then run as that session."""
    return CookieJar(policy=DefaultCookiePolicy(allowed_domains=[]))


def parse_upstream(text: str) -> Upstream:
    """Parse ``http://host[:port][/prefix]``, ``https://...`` or ``unix:/path/to.sock``."""
    if text.startswith(UNIX_PREFIX):
        path = text.removeprefix(UNIX_PREFIX)
        if not path.startswith("/"):
            raise BadUpstreamURL(f"unix upstream needs an absolute socket path, got {text!r}")
        return Upstream(origin=UNIX_ORIGIN, uds=path)
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise BadUpstreamURL(f"expected http://, https:// or unix:/path, got {text!r}")
    if parts.query or parts.fragment:
        raise BadUpstreamURL(f"upstream URL must not carry a query or fragment, got {text!r}")
    if parts.username or parts.password:
        raise BadUpstreamURL("upstream URL must not carry credentials; use the key or token file")
    return Upstream(origin=f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}")
