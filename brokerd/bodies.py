"""Reading request bodies within limits: a cap per route, a deadline, and one memory budget.

Every socket of brokerd reads whole request bodies into memory (the proxies check and then
forward them, the broker parses them). Without bounds a client could make brokerd hold as many
bodies as it has connections, each as large as the cap, and never finish sending them (twelve
unfinished 63 MiB bodies took brokerd from 47 to 804 MiB). So:

- a body over its route's cap is refused (413), before reading when Content-Length says so;
- a body must arrive whole within ``timeout_s`` (408);
- all bodies held at once, on every socket, share one ``BodyBudget``: a request whose
  Content-Length does not fit in what is left is refused (503) before its body is read, and a
  body without a Content-Length takes its bytes from the budget as they arrive.
"""

from dataclasses import dataclass, field
from typing import Final

import anyio
from starlette.types import Receive, Scope

from brokerd.errors import BrokerdError

DEFAULT_BUDGET_BYTES: Final = 128 * 1024 * 1024
DEFAULT_BODY_TIMEOUT_S: Final = 60.0


class BodyRefused(BrokerdError):
    """A request body the server will not hold; ``status`` is the HTTP answer."""

    status = 400


class BodyTooLarge(BodyRefused):
    status = 413

    def __init__(self, cap: int) -> None:
        super().__init__(f"request body over the {cap}-byte limit")
        self.cap = cap


class BodiesBusy(BodyRefused):
    status = 503

    def __init__(self) -> None:
        super().__init__("brokerd is holding as many request bodies as it may; retry shortly")


class BodyTimeout(BodyRefused):
    status = 408

    def __init__(self, timeout_s: float) -> None:
        super().__init__(f"request body not received within {timeout_s:g} s")


class ClientGone(BrokerdError):
    """The client hung up before its request body was complete."""


class BodyBudget:
    """Request-body bytes held in memory at once, across every socket of the process."""

    def __init__(self, limit: int = DEFAULT_BUDGET_BYTES) -> None:
        self.limit = limit
        self.held = 0

    def reserve(self, size: int) -> bool:
        if self.held + size > self.limit:
            return False
        self.held += size
        return True

    def release(self, size: int) -> None:
        self.held -= size


@dataclass(frozen=True)
class BodyRules:
    """What every body on one socket shares: the process's budget and the deadline."""

    budget: BodyBudget = field(default_factory=BodyBudget)
    timeout_s: float = DEFAULT_BODY_TIMEOUT_S


@dataclass
class HeldBody:
    """A body read whole; ``release`` gives its bytes back to the budget (once)."""

    data: bytes
    budget: BodyBudget
    reserved: int

    def release(self) -> None:
        self.budget.release(self.reserved)
        self.reserved = 0


def declared_length(scope: Scope) -> int | None:
    """The request's Content-Length, if it sent a well-formed one."""
    for name, value in scope["headers"]:
        if name.lower() == b"content-length" and value.strip().isdigit():
            return int(value)
    return None


async def read_body(scope: Scope, receive: Receive, cap: int, rules: BodyRules) -> HeldBody:
    """The whole request body within ``cap`` and ``rules``; the caller releases it.

    Raises ``BodyRefused`` (with its status) or ``ClientGone``.
    """
    budget = rules.budget
    length = declared_length(scope)
    if length is not None and length > cap:
        raise BodyTooLarge(cap)
    if length is not None and not budget.reserve(length):
        raise BodiesBusy
    held = HeldBody(b"", budget, length or 0)
    try:
        with anyio.fail_after(rules.timeout_s):
            held.data = await _receive_all(receive, cap, held, incremental=length is None)
    except TimeoutError:
        held.release()
        raise BodyTimeout(rules.timeout_s) from None
    except BaseException:
        held.release()
        raise
    return held


async def _receive_all(receive: Receive, cap: int, held: HeldBody, *, incremental: bool) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk: bytes = message.get("body", b"")
        size += len(chunk)
        if size > cap:
            raise BodyTooLarge(cap)
        if incremental:
            if not held.budget.reserve(len(chunk)):
                raise BodiesBusy
            held.reserved += len(chunk)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)
