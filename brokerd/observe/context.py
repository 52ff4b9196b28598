"""The request under way in this task: which socket, and loopd's request id and session.

loopd sends ``X-Loopd-Request`` and ``X-Loopd-Session`` with every request it makes for a model
request or a tool call (``loopd.observe.context``). The box writes them, so they are checked
before they are believed: an id or a name of unexpected characters or length is ignored, never
logged. ``ContextFields`` adds what is known to every log line made while the request runs, as
loopd's filter does on its side, so the two daemons' lines join on ``request_id``.
"""

import logging
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Final

REQUEST_HEADER: Final = b"x-loopd-request"
SESSION_HEADER: Final = b"x-loopd-session"
LOOPD_HEADERS: Final = frozenset({REQUEST_HEADER, SESSION_HEADER})
_REQUEST_ID: Final = re.compile(rb"[A-Za-z0-9._-]{1,64}")
_SESSION: Final = re.compile(rb"[\x21-\x7e]{1,200}")  # printable ASCII, no space


@dataclass(frozen=True)
class RequestContext:
    socket: str
    request_id: str | None = None
    session: str | None = None

    def fields(self) -> dict[str, str]:
        out = {"socket": self.socket}
        if self.session is not None:
            out["session"] = self.session
        if self.request_id is not None:
            out["request_id"] = self.request_id
        return out


_current: ContextVar[RequestContext | None] = ContextVar("brokerd_request", default=None)


def current() -> RequestContext | None:
    return _current.get()


def from_headers(socket: str, headers: Iterable[tuple[bytes, bytes]]) -> RequestContext:
    """The context of a request to ``socket``; loopd's headers only when well formed."""
    request_id = session = None
    for name, value in headers:
        lower = name.lower()
        if lower == REQUEST_HEADER and _REQUEST_ID.fullmatch(value):
            request_id = value.decode("ascii")
        elif lower == SESSION_HEADER and _SESSION.fullmatch(value):
            session = value.decode("ascii")
    return RequestContext(socket, request_id, session)


@contextmanager
def entered(context: RequestContext) -> Iterator[RequestContext]:
    token = _current.set(context)
    try:
        yield context
    finally:
        _current.reset(token)


class ContextFields(logging.Filter):
    """Adds the request's ``socket``, ``session`` and ``request_id`` to each record's fields
    (the line's own fields win)."""

    def filter(self, record: logging.LogRecord) -> bool:
        context = current()
        if context is not None:
            own = getattr(record, "fields", None)
            merged: dict[str, object] = dict(context.fields())
            if isinstance(own, dict):
                merged.update(own)
            record.fields = merged
        return True
