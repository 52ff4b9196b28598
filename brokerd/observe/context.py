"""The request under way in this task: which socket, and loopd's request id and session.

loopd sends ``X-Loopd-Request`` and ``X-Loopd-Session`` with every request it makes for a model
request or a tool call (``loopcommon.context`` names them). The box writes them, so they are
checked before they are believed: an id or a name of unexpected characters or length is ignored,
never logged. The shared log filter adds what is known to every log line made while the request
runs, as on loopd's side, so the two daemons' lines join on ``request_id``.
"""

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Final

from loopcommon.context import (
    REQUEST_HEADER,
    REQUEST_ID_SHAPE,
    SESSION_HEADER,
    SESSION_SHAPE,
    log_fields,
)

_REQUEST: Final = REQUEST_HEADER.lower().encode("ascii")
_SESSION: Final = SESSION_HEADER.lower().encode("ascii")
LOOPD_HEADERS: Final = frozenset({_REQUEST, _SESSION})


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
        text = value.decode("latin-1")
        if lower == _REQUEST and REQUEST_ID_SHAPE.fullmatch(text):
            request_id = text
        elif lower == _SESSION and SESSION_SHAPE.fullmatch(text):
            session = text
    return RequestContext(socket, request_id, session)


@contextmanager
def entered(context: RequestContext) -> Iterator[RequestContext]:
    token = _current.set(context)
    try:
        with log_fields(context.fields()):
            yield context
    finally:
        _current.reset(token)
