"""One id per model request and per tool call, carried from loopd to brokerd and into both logs.

The id lives in a context variable, so it follows the work through every await and every task the
work starts (the slot watch's ``/slots`` polls carry the id of the request they wait for), without
being passed down through the engine. Three things read it:

- the shared log filter (``loopcommon.context.ContextFields``): every line logged inside a scope
  gets ``session`` and ``request_id`` as fields (JSON fields in the JSON format), beside the line's
  own;
- the event hooks of loopd's two HTTP clients (``inference_hooks``, ``broker_hooks``): each
  request sent inside a scope carries ``X-Loopd-Request`` and ``X-Loopd-Session``; brokerd logs
  them next to its own fields (``brokerd.observe``), so the two daemons' lines join on the id;
- the broker hook also notes brokerd's answer (its HTTP status and the call's ``status``) for the
  tool-call metrics (``loopd.observe.toolcalls``).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Final, Protocol

from loopcommon.context import REQUEST_HEADER, SESSION_HEADER, log_fields

# brokerd's answer to a tool call is read for its status only below this size (results are
# capped by brokerd; a larger body is left to the client and the status stays unknown).
STATUS_READ_CAP: Final = 4 * 1024 * 1024


@dataclass
class Scope:
    """The work under way in this task: its session, and the id of its request when it is one."""

    session: str | None
    request_id: str | None = None
    sent: bool = False  # a request left with this scope's headers
    http_status: int | None = None  # brokerd's HTTP status, when it answered
    answer_status: str | None = None  # brokerd's ``status`` of a tool call, when it said one

    def fields(self) -> dict[str, str]:
        out = {}
        if self.session is not None:
            out["session"] = self.session
        if self.request_id is not None:
            out["request_id"] = self.request_id
        return out


_current: ContextVar[Scope | None] = ContextVar("loopd_observe_scope", default=None)


def current() -> Scope | None:
    return _current.get()


def new_request_id() -> str:
    """16 hex digits: unique enough to join one daemon's lines to the other's."""
    return secrets.token_hex(8)


@contextmanager
def _entered(scope: Scope) -> Iterator[Scope]:
    token = _current.set(scope)
    try:
        with log_fields(scope.fields()):
            yield scope
    finally:
        _current.reset(token)


@contextmanager
def session_scope(session: str) -> Iterator[Scope]:
    """Work for ``session`` with no request id of its own (a whole turn)."""
    with _entered(Scope(session)) as scope:
        yield scope


@contextmanager
def request_scope(session: str | None = None) -> Iterator[Scope]:
    """One model request or tool call: a fresh id, and the session of the scope around it
    unless one is given."""
    outer = current()
    name = session if session is not None else (outer.session if outer else None)
    with _entered(Scope(name, new_request_id())) as scope:
        yield scope


class _Headers(Protocol):
    def __setitem__(self, key: str, value: str) -> None: ...

    def get(self, key: str, default: Any = None) -> Any: ...


class _Request(Protocol):
    """What the request hook touches of the client's request (httpx's, in the transports)."""

    @property
    def headers(self) -> _Headers: ...


class _Response(Protocol):
    @property
    def headers(self) -> _Headers: ...

    @property
    def status_code(self) -> int: ...

    @property
    def is_success(self) -> bool: ...

    async def aread(self) -> bytes: ...


async def _add_headers(request: _Request) -> None:
    scope = current()
    if scope is None:
        return
    if scope.request_id is not None:
        request.headers[REQUEST_HEADER] = scope.request_id
    if scope.session is not None and scope.session.isascii() and scope.session.isprintable():
        request.headers[SESSION_HEADER] = scope.session
    scope.sent = True


async def _note_answer(response: _Response) -> None:
    scope = current()
    if scope is None or scope.request_id is None:
        return
    scope.http_status = response.status_code
    length = response.headers.get("content-length", "")
    if not response.is_success or not length.isdigit() or int(length) > STATUS_READ_CAP:
        return
    # httpx documents reading the body inside a response hook; the client then finds it read.
    try:
        payload: Any = json.loads(await response.aread())
    except ValueError:
        return
    status = payload.get("status") if isinstance(payload, dict) else None
    if isinstance(status, str) and len(status) <= 32:
        scope.answer_status = status


Hook = Callable[[Any], Awaitable[None]]


def inference_hooks() -> dict[str, list[Hook]]:
    """Event hooks for the client towards llama-server (or brokerd's inference proxy): headers
    only; a streamed answer's body is never touched here."""
    return {"request": [_add_headers]}


def broker_hooks() -> dict[str, list[Hook]]:
    """Event hooks for the client towards brokerd's tool broker: headers, and brokerd's answer."""
    return {"request": [_add_headers], "response": [_note_answer]}
