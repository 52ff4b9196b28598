"""The ASGI wrapper around each of brokerd's socket apps.

For every request it: reads loopd's ``X-Loopd-Request`` and ``X-Loopd-Session`` into the request's
context (and removes them, so they never reach llama-server or Mattermost); counts the request by
socket, route and status, and its duration; counts body bytes as they pass (those sent, and
those written by the server's ``ClientWrites``) and adds them to the metric every ``FLUSH_BYTES``
and at the end, so a scrape during a long stream sees them grow while a chunk costs an addition,
not the metric's lock; and keeps the in-flight gauge.
"""

import time
from collections.abc import Callable
from typing import Final

from prometheus_client import Counter
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from brokerd.listen import CLIENT_WRITES, CountedWrites
from brokerd.observe.context import LOOPD_HEADERS, entered, from_headers
from brokerd.observe.metrics import BROKERD_METRICS, BrokerdMetrics

RouteLabel = Callable[[str, str], str]
"""(method, path) -> the route's label: its template, or ``other``."""

# How many body bytes a request counts before it adds them to the metric.
FLUSH_BYTES: Final = 64 * 1024

BROKER_ROUTES: Final = frozenset(
    {("POST", "/v1/find_tool"), ("POST", "/v1/call_tool"), ("GET", "/v1/health")}
)


def infer_route(method: str, path: str) -> str:
    from brokerd.proxy.inference import ALLOWED_ROUTES
    from brokerd.proxy.slotactions import is_slot_action

    if is_slot_action(method, path):
        return "/slots/{id}"  # one label for every slot: a label per id would grow unbounded
    return path if (method, path) in ALLOWED_ROUTES else "other"


def chat_route(method: str, path: str) -> str:
    from brokerd.proxy.chat import match_route

    matched = match_route(method, path)
    return matched[0].template if matched is not None else "other"


def broker_route(method: str, path: str) -> str:
    return path if (method, path) in BROKER_ROUTES else "other"


ROUTES: Final[dict[str, RouteLabel]] = {
    "infer": infer_route,
    "chat": chat_route,
    "broker": broker_route,
}


class ByteTally:
    """Body bytes passing one way for one request, added to ``counter`` in steps."""

    def __init__(self, counter: Counter) -> None:
        self.counter = counter
        self.pending = 0

    def add(self, size: int) -> None:
        self.pending += size
        if self.pending >= FLUSH_BYTES:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            self.counter.inc(self.pending)
            self.pending = 0


class Instrumented:
    """``app`` served on ``socket``, observed."""

    def __init__(self, socket: str, app: ASGIApp, metrics: BrokerdMetrics = BROKERD_METRICS):
        self.socket = socket
        self.app = app
        self.metrics = metrics
        # infer-NAME (one socket per inference endpoint) takes infer's routes.
        self.route = ROUTES.get(socket.split("-", 1)[0], broker_route)

    def __getattr__(self, name: str) -> object:
        # The wrapped app's attributes (``state``) stay reachable, as a Starlette app's are.
        return getattr(self.app, name)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        context = from_headers(self.socket, scope["headers"])
        scope = dict(scope)
        scope["headers"] = [(n, v) for n, v in scope["headers"] if n.lower() not in LOOPD_HEADERS]
        route = self.route(scope.get("method", "GET"), scope["path"])
        to_box = ByteTally(self.metrics.bytes.labels(self.socket, "to_box"))
        from_box = ByteTally(self.metrics.bytes.labels(self.socket, "from_box"))
        status = "none"  # no answer began: the client left first
        extensions = scope.get("extensions") or {}
        if (writes := extensions.get(CLIENT_WRITES)) is not None:
            scope["extensions"] = {**extensions, CLIENT_WRITES: CountedWrites(writes, to_box.add)}

        async def counted_receive() -> Message:
            message = await receive()
            body = message.get("bytes") or message.get("body") or message.get("text") or b""
            if body and message["type"] in ("http.request", "websocket.receive"):
                from_box.add(len(body.encode() if isinstance(body, str) else body))
            return message

        async def counted_send(message: Message) -> None:
            nonlocal status
            kind = message["type"]
            if kind == "http.response.start":
                status = str(message["status"])
            elif kind == "websocket.accept":
                status = "101"
            elif kind == "websocket.close" and status == "none":
                status = "403"  # closed before accepting: refused
            body = message.get("body") or message.get("bytes") or message.get("text") or b""
            if body and kind in ("http.response.body", "websocket.send"):
                to_box.add(len(body.encode() if isinstance(body, str) else body))
            await send(message)

        in_flight = self.metrics.in_flight.labels(self.socket)
        in_flight.inc()
        started = time.monotonic()
        try:
            with entered(context):
                await self.app(scope, counted_receive, counted_send)
        finally:
            to_box.flush()
            from_box.flush()
            in_flight.dec()
            self.metrics.served(self.socket, route, status, time.monotonic() - started)


def instrument(socket: str, app: ASGIApp) -> Instrumented:
    return Instrumented(socket, app)
