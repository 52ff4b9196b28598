"""loopd's metrics and status page, read from its socket in a folder the box mounts.

loopd runs with no network; it serves its pages on a Unix socket in a folder of the host account
that the container mounts (``LOOPD_METRICS_ADDR=unix:/run/loopd-metrics/metrics.sock``; on the
host ``~/.local/state/loopd/metrics``, deploy/loopd.container). brokerd reads them there
(``metrics_relay``) and serves them on its own metrics address under ``/loopd/``. The box writes
that folder, so everything read from it is hostile input:

- the socket is opened without following links (``O_PATH | O_NOFOLLOW``) and must be a socket,
  then connected through ``/proc/self/fd``: a link the box put there (to brokerd's own sockets, to
  podman's API) is refused, not followed;
- only three fixed paths are asked for, with ``GET``, and nothing of the operator's request (no
  query, no header) is passed on;
- an answer must be 200, unencoded, at most its page's ``max_bytes`` (``MAX_BYTES`` for the
  metrics; for the status data ``STATUS_MAX_BYTES``, which its bounded types fit in) and complete
  within ``TIMEOUT_S``;
  ``MAX_AT_ONCE`` relays run at once (more are answered 503 at once), so a box that stalls
  cannot tie brokerd up;
- what goes back to the operator carries brokerd's own content type for the path, and a
  Content-Security-Policy that lets the page run no script, load nothing, and (``sandbox``)
  follow no ``<meta http-equiv="refresh">``, which ``default-src 'none'`` alone lets Chromium
  follow; the status page itself is never the box's markup: brokerd renders it from loopd's
  status data (``brokerd.observe.statuspage``), which its types bound (slots, sessions, points,
  string lengths), so the page costs what the largest valid data costs, however much the box
  sends; it is rendered in a worker thread, never on the loop that serves the sockets.
"""

import contextlib
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import anyio
import anyio.abc
import h11
from prometheus_client import CONTENT_TYPE_LATEST

from brokerd.errors import BrokerdError
from brokerd.observe.statuspage import NotAStatus, render_status
from loopcommon.statuspage import REFRESH_S, STATUS_MAX_BYTES

MAX_BYTES: Final = 8 * 1024 * 1024
MAX_HEAD_BYTES: Final = 16 * 1024  # a status line and headers larger than this are refused
READ_BYTES: Final = 64 * 1024
TIMEOUT_S: Final = 5.0
MAX_AT_ONCE: Final = 2
PAGE_POLICY: Final = (
    "sandbox; default-src 'none'; style-src 'unsafe-inline'; img-src data:; "
    "form-action 'none'; base-uri 'none'; frame-ancestors 'none'"
)


@dataclass(frozen=True)
class Page:
    """A page brokerd serves under /loopd: the path it asks loopd for, the content type it
    sends, how loopd's answer becomes the page (None: as it is), the page's refresh period
    (sent as the ``Refresh`` header, which the sandbox leaves working) and the most it reads of
    loopd's answer."""

    source: str
    content_type: str
    render: Callable[[bytes, str | None], bytes] | None = None  # the body, Mattermost's URL
    refresh_s: int | None = None
    max_bytes: int = MAX_BYTES


# brokerd's path (under /loopd) -> the page.
PAGES: Final = {
    "/loopd/metrics": Page("/metrics", CONTENT_TYPE_LATEST),
    "/loopd/": Page(
        "/status.json", "text/html; charset=utf-8", render_status, REFRESH_S, STATUS_MAX_BYTES
    ),
    "/loopd/status.json": Page("/status.json", "application/json", max_bytes=STATUS_MAX_BYTES),
}


class RelayError(BrokerdError):
    """loopd's page could not be relayed; the message says why (for the 502 and the log)."""


class RelayBusy(RelayError):
    """``MAX_AT_ONCE`` relays are under way already (answered 503)."""


@dataclass(frozen=True)
class Relayed:
    body: bytes
    content_type: str
    refresh_s: int | None = None

    def headers(self) -> dict[str, str]:
        headers = {
            "Content-Security-Policy": PAGE_POLICY,
            "X-Content-Type-Options": "nosniff",
            "Cache-Control": "no-store",
            "Referrer-Policy": "no-referrer",
        }
        if self.refresh_s is not None:
            headers["Refresh"] = str(self.refresh_s)
        return headers


@contextlib.contextmanager
def socket_by_descriptor(path: Path) -> Iterator[str]:
    """A path that connects to the socket at ``path`` itself, never to what a link there names;
    ``RelayError`` when nothing, a link or something other than a socket is there."""
    try:
        fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise RelayError(f"loopd's metrics socket {path}: {exc.strerror}") from None
    try:
        if not stat.S_ISSOCK(os.fstat(fd).st_mode):
            raise RelayError(f"{path} is not a socket (a link or a file); not following it")
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)


class LoopdRelay:
    def __init__(
        self, socket_path: Path, *, timeout_s: float = TIMEOUT_S, thread_url: str | None = None
    ) -> None:
        """``thread_url``: Mattermost's address, where the status page's threads link to."""
        self.socket_path = socket_path
        self.timeout_s = timeout_s
        self.thread_url = thread_url
        self._slots = anyio.Semaphore(MAX_AT_ONCE)

    async def fetch(self, page: str) -> Relayed:
        """brokerd's ``page`` (a key of ``PAGES``), from what loopd serves."""
        served = PAGES[page]
        if self._slots.value == 0:
            raise RelayBusy(f"{MAX_AT_ONCE} reads of loopd's metrics are already under way")
        async with self._slots:
            try:
                with anyio.fail_after(self.timeout_s):
                    body = await self._get(served.source, served.max_bytes)
            except TimeoutError:
                raise RelayError(
                    f"loopd's metrics socket did not answer in {self.timeout_s:g} s"
                ) from None
            if served.render is not None:
                # Bounded data to check and render: off the loop that serves the sockets, and
                # within the slot, so at most MAX_AT_ONCE renders run.
                try:
                    body = await anyio.to_thread.run_sync(served.render, body, self.thread_url)
                except NotAStatus as exc:
                    raise RelayError(f"loopd's {served.source} is not a status: {exc}") from None
        return Relayed(body, served.content_type, served.refresh_s)

    async def _get(self, path: str, max_bytes: int) -> bytes:
        with socket_by_descriptor(self.socket_path) as target:
            try:
                stream = await anyio.connect_unix(target)
            except OSError as exc:
                raise RelayError(f"loopd's metrics socket: {exc.strerror or exc}") from None
            async with stream:
                try:
                    return await _exchange(stream, path, max_bytes)
                except (OSError, anyio.BrokenResourceError, h11.ProtocolError) as exc:
                    raise RelayError(
                        f"loopd's metrics socket: {exc or type(exc).__name__}"
                    ) from None


async def _exchange(stream: anyio.abc.ByteStream, path: str, max_bytes: int) -> bytes:
    """One ``GET path`` over ``stream`` (h11, strict about what comes back); the body, at most
    ``max_bytes``."""
    connection = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD_BYTES)
    headers = [("Host", "loopd"), ("Accept-Encoding", "identity"), ("Connection", "close")]
    await stream.send(connection.send(h11.Request(method="GET", target=path, headers=headers)))
    await stream.send(connection.send(h11.EndOfMessage()))
    body = bytearray()
    while True:
        event = connection.next_event()
        if event is h11.NEED_DATA:
            try:
                connection.receive_data(await stream.receive(READ_BYTES))
            except anyio.EndOfStream:
                connection.receive_data(b"")
        elif isinstance(event, h11.Response):
            if event.status_code != 200:
                raise RelayError(f"loopd answered {event.status_code} for {path}")
            encoding = dict(event.headers).get(b"content-encoding", b"identity")
            if encoding.lower() != b"identity":
                raise RelayError("loopd's answer is encoded; brokerd relays plain bodies only")
        elif isinstance(event, h11.Data):
            body += event.data
            if len(body) > max_bytes:
                raise RelayError(f"loopd's answer for {path} is over {max_bytes} bytes")
        elif isinstance(event, h11.EndOfMessage):
            return bytes(body)
        elif isinstance(event, h11.ConnectionClosed):
            raise RelayError(f"loopd closed the connection before its answer for {path} ended")
