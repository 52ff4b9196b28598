"""The broker's HTTP API, served on brokerd's ``broker.sock``.

``POST /v1/find_tool`` ``{"session", "query"}`` -> ``{"result", "names"}``
``POST /v1/call_tool`` ``{"session", "call_id", "name", "arguments"[, "approval"]}`` ->
``{"result", "status"}`` (plus ``recorded_status`` when ``status`` is ``replayed``, and
``approval_id`` and the tool's ``description`` when it is ``needs_approval``: the call waits for
a person, ``brokerd.approval``; loopd sends it again with ``"approval": {"id", "decision", "by"}``)
``GET /v1/health`` -> ``{"status": "ok", "tools": n}``

A malformed request (not JSON, nested deeper than ``MAX_BODY_DEPTH``, a field missing) gets
400, a body over ``body_cap_bytes`` 413, one not sent in time 408, one that the memory budget
cannot hold now 503, and a call id reused for a different call 409, each as
``{"error": message}``. Everything the model did wrong (unknown tool, bad arguments, a tool that
failed) is a normal 200 answer whose ``result`` says so: the turn goes on.
"""

import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from brokerd.approval import ApprovalBody
from brokerd.bodies import BodyRefused, BodyRules, ClientGone, read_body
from brokerd.observe.metrics import BROKERD_METRICS, body_reason
from brokerd.observe.toolcalls import tool_call
from brokerd.tools.arguments import nests_deeper
from brokerd.tools.audit import AuditLogError
from brokerd.tools.builtins import WebTransport
from brokerd.tools.errors import CallConflictError, RequestError
from brokerd.tools.service import ToolBroker
from brokerd.tools.settings import BrokerSettings

if TYPE_CHECKING:
    from brokerd.mcp.config import McpServerConfig

Body = TypeVar("Body", bound=BaseModel)
REFUSED_STATUSES = {400: "bad_request", 409: "call_conflict"}  # reasons in brokerd's metrics
# Far more than any tool's arguments need, far less than what makes a parser recurse too deep.
MAX_BODY_DEPTH = 64


# Names are stored whole in every audit row; the query and arguments are stored bounded.
MAX_NAME_CHARS = 256


class FindToolBody(BaseModel):
    model_config = ConfigDict(extra="ignore")
    session: str = Field(min_length=1, max_length=MAX_NAME_CHARS)
    query: str


class CallToolBody(BaseModel):
    model_config = ConfigDict(extra="ignore")
    session: str = Field(min_length=1, max_length=MAX_NAME_CHARS)
    call_id: str = Field(min_length=1, max_length=MAX_NAME_CHARS)
    name: str = Field(max_length=MAX_NAME_CHARS)
    # The model's argument text, as produced; an already-parsed JSON value is accepted too.
    arguments: Any = Field(...)
    # A person's decision on a call of a tool that asks (``brokerd.approval``), sent by loopd.
    approval: ApprovalBody | None = None


def parse_body(model: type[Body], raw: bytes) -> Body:
    """Parse a request body, or raise ``RequestError`` naming what is wrong with it."""
    try:
        value = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RequestError(f"the request body is not JSON: {exc}") from exc
    except RecursionError:
        raise RequestError(f"the request body nests deeper than {MAX_BODY_DEPTH} levels") from None
    if nests_deeper(value, MAX_BODY_DEPTH):
        raise RequestError(f"the request body nests deeper than {MAX_BODY_DEPTH} levels")
    if not isinstance(value, dict):
        raise RequestError("the request body must be a JSON object")
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error['loc'])}: {error['msg'].lower()}"
            for error in exc.errors()
        )
        raise RequestError(f"bad request: {problems}") from exc


def create_broker_app(
    settings: BrokerSettings,
    *,
    transport: WebTransport | None = None,
    hidden: Sequence[Path] = (),
    bodies: BodyRules | None = None,
    mcp: "Sequence[McpServerConfig]" = (),
) -> Starlette:
    """The broker as an ASGI app. The catalogue is loaded here, so a bad catalogue fails at
    startup with ``CatalogueError`` (``ConfinementError`` when its command tools cannot run
    confined); ``hidden`` are brokerd's own paths that no tool may see; ``transport`` replaces
    web_fetch's network (tests only). The ``mcp`` servers run from startup to shutdown."""
    broker = ToolBroker.open(settings, transport=transport, hidden=hidden, mcp=mcp)
    if broker.mcp:
        BROKERD_METRICS.watch_mcp(broker.mcp)
    body_rules = bodies or BodyRules()

    async def read(request: Request) -> bytes:
        held = await read_body(request.scope, request.receive, settings.body_cap_bytes, body_rules)
        held.release()  # parsed at once and dropped; only the parsed value lives on
        return held.data

    async def find_tool(request: Request) -> Response:
        body = parse_body(FindToolBody, await read(request))
        found = broker.find_tool(body.session, body.query)
        return JSONResponse({"result": found.result, "names": list(found.names)})

    async def call_tool(request: Request) -> Response:
        body = parse_body(CallToolBody, await read(request))
        with tool_call(body.session, body.call_id, body.name, broker.catalogue) as seen:
            answer = seen.answered(
                await broker.call_tool(
                    body.session, body.call_id, body.name, body.arguments, body.approval
                )
            )
        payload: dict[str, str] = {"result": answer.result, "status": answer.status}
        if answer.recorded_status is not None:
            payload["recorded_status"] = answer.recorded_status
        if answer.approval_id is not None:
            payload["approval_id"] = answer.approval_id
        if answer.description is not None:
            payload["description"] = answer.description
        return JSONResponse(payload)

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", "tools": len(broker.catalogue)})

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            async with anyio.create_task_group() as servers:
                if broker.mcp:
                    await servers.start(broker.mcp.run)
                yield
                servers.cancel_scope.cancel()  # stops every MCP server
        finally:
            broker.close()

    app = Starlette(
        routes=[
            Route("/v1/find_tool", find_tool, methods=["POST"]),
            Route("/v1/call_tool", call_tool, methods=["POST"]),
            Route("/v1/health", health, methods=["GET"]),
        ],
        exception_handlers={
            BodyRefused: _body_refused,
            ClientGone: _body_refused,
            RequestError: _error_response(400),
            CallConflictError: _error_response(409),
            AuditLogError: _error_response(500),
        },
        lifespan=lifespan,
    )
    app.state.broker = broker
    return app


async def _body_refused(request: Request, exc: Exception) -> Response:
    # The rest of the body may be unread: ending the connection discards it.
    status = exc.status if isinstance(exc, BodyRefused) else 400
    BROKERD_METRICS.refused(body_reason(status))
    headers = {"Connection": "close"}
    return JSONResponse({"error": str(exc) or "the client left"}, status, headers=headers)


def _error_response(status_code: int) -> Callable[[Request, Exception], Awaitable[Response]]:
    async def handler(request: Request, exc: Exception) -> Response:
        if status_code in REFUSED_STATUSES:
            BROKERD_METRICS.refused(REFUSED_STATUSES[status_code])
        return JSONResponse({"error": str(exc)}, status_code=status_code)

    return handler
