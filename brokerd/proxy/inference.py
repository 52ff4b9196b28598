"""The inference proxy: the box's only way to llama-server, through an allowlist.

The allowlist is one table of (method, path). Paths match exactly, after the ASGI server's
percent-decoding, so no spelling (``//slots``, ``/v1/../slots/0``, ``/slots%2F0``) reaches a route
the table does not name; the path forwarded is the very string that was checked. Query strings
pass through untouched, except that ``GET /slots`` refuses an ``action`` parameter. Beside the
table, ``POST /slots/{id}`` passes for a save or a restore of the box's own slot under a file name
of loopd's shape (``brokerd.proxy.slotactions``).

The server is shared, so brokerd's config also bounds what the box may use of it
(``InferencePolicy``): a chat request must name one of ``inference_slots`` as its ``id_slot``, and
every request that names a model (body ``model``, or a ``model`` query parameter) one of
``inference_models``; empty lists allow any. ``id_slot`` -1 or absent is refused while slots are
set: llama-server then picks any idle slot, which may be another client's. While slots are set,
a chat request may also carry only the fields ``brokerd.proxy.requestfields`` allows, within
their bounds (``n_cmpl``, for one, starts completions on other slots). With several servers
(``[[endpoint]]`` tables) each socket is one server's, under that server's rules: a model or slot
the box is given on another server only is refused here, and the refusal names this one.
"""

import json
import logging
from dataclasses import dataclass
from typing import Final
from urllib.parse import unquote_plus

from starlette.applications import Starlette
from starlette.routing import Route

from brokerd.bodies import BodyRules
from brokerd.proxy.forward import BodyCap, Forwarder, ForwardRules, Refused
from brokerd.proxy.headers import FORWARDING_HEADERS, REQUEST_FRAMING, query_keys
from brokerd.proxy.lifespan import closing_lifespan
from brokerd.proxy.relay import json_error
from brokerd.proxy.requestfields import field_refusal
from brokerd.proxy.slotactions import action_of, is_slot_action
from brokerd.proxy.slotactions import body_refusal as slot_body_refusal
from brokerd.proxy.slotactions import query_refusal as slot_query_refusal
from brokerd.proxy.slotfolder import SlotFolder
from brokerd.proxy.upstream import Upstream
from brokerd.tools.arguments import nests_deeper

logger = logging.getLogger(__name__)

ALLOWED_ROUTES: Final[frozenset[tuple[str, str]]] = frozenset(
    {
        ("POST", "/v1/chat/completions"),
        ("POST", "/chat/completions"),
        ("POST", "/v1/chat/completions/control"),
        ("GET", "/slots"),
        ("GET", "/props"),
        ("GET", "/health"),
        ("GET", "/v1/health"),
        ("GET", "/models"),
        ("GET", "/v1/models"),
        ("POST", "/apply-template"),
        ("POST", "/tokenize"),
    }
)

# Credentials the box might send (it has none to send; anything here is stray or hostile), and the
# header that would turn on llama-server's resumable streams, which outlive a client hang-up.
DROPPED_REQUEST_HEADERS: Final = (
    REQUEST_FRAMING
    | FORWARDING_HEADERS
    | frozenset({b"authorization", b"x-api-key", b"cookie", b"x-conversation-id"})
)

DEFAULT_BODY_CAP: Final = 64 * 1024 * 1024
# The routes whose body is a whole conversation (or a prompt) get the configured cap; the others
# carry a few small fields.
LARGE_BODY_ROUTES: Final = frozenset(
    {
        ("POST", "/v1/chat/completions"),
        ("POST", "/chat/completions"),
        ("POST", "/apply-template"),
        ("POST", "/tokenize"),
    }
)
SMALL_BODY_CAP: Final = 64 * 1024


def body_cap_for(large_cap: int) -> BodyCap:
    """Each route's body cap: ``large_cap`` for a conversation, 64 KiB for the rest."""

    def cap(method: str, path: str) -> int:
        return large_cap if (method, path) in LARGE_BODY_ROUTES else SMALL_BODY_CAP

    return cap


def refusal(method: str, path: str, query: bytes) -> str | None:
    """Why the inference proxy refuses this request, or None when it may pass."""
    if is_slot_action(method, path):
        return slot_query_refusal(path, query)
    if (method, path) not in ALLOWED_ROUTES:
        return f"brokerd refuses {method} {path}: not in the inference proxy's allowlist"
    if path == "/slots" and "action" in query_keys(query):
        return f"brokerd refuses {method} {path} with an action: slot actions are not allowed"
    return None


# Chat requests use a slot; the other POST routes carry a model but run on no slot.
SLOT_ROUTES: Final = frozenset({("POST", "/v1/chat/completions"), ("POST", "/chat/completions")})
JSON_ROUTES: Final = frozenset({*LARGE_BODY_ROUTES, ("POST", "/v1/chat/completions/control")})
# Deeper bodies are refused before they reach llama-server's parser.
MAX_BODY_DEPTH: Final = 256


@dataclass(frozen=True)
class InferencePolicy:
    """The slots and models the box may use on the shared server; empty means any.
    ``endpoint``: the server's name when brokerd serves several (it is named in refusals)."""

    slots: frozenset[int] = frozenset()
    models: frozenset[str] = frozenset()
    endpoint: str | None = None

    @property
    def where(self) -> str:
        return f" on endpoint {self.endpoint}" if self.endpoint is not None else ""


def body_refusal(policy: InferencePolicy, method: str, path: str, body: bytes) -> Refused | None:
    """Why a request with this body may not reach the server, or None (pure)."""
    slot_action = is_slot_action(method, path)
    if (method, path) not in JSON_ROUTES and not slot_action:
        return None
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        value = None
    if not isinstance(value, dict):
        return Refused(400, f"brokerd refuses {method} {path}: the body is not a JSON object")
    if nests_deeper(value, MAX_BODY_DEPTH):
        return Refused(400, f"brokerd refuses {method} {path}: the body nests too deeply")
    if policy.models and value.get("model") not in policy.models:
        allowed = ", ".join(sorted(policy.models))
        return Refused(
            403, f"brokerd refuses model {value.get('model')!r}{policy.where}: allowed {allowed}"
        )
    if slot_action:
        why = slot_body_refusal(path, policy.slots, policy.where, value)
        return Refused(403, why) if why is not None else None
    if policy.slots and (method, path) in SLOT_ROUTES:
        slot = value.get("id_slot")
        if not (isinstance(slot, int) and not isinstance(slot, bool) and slot in policy.slots):
            allowed = ", ".join(str(s) for s in sorted(policy.slots))
            return Refused(
                403,
                f"brokerd refuses id_slot {slot!r}{policy.where}: a request must name {allowed}",
            )
        if (refused := field_refusal(value)) is not None:
            name, why = refused
            return Refused(403, f"brokerd refuses the field {name!r}{policy.where}: {why}")
    return None


def query_refusal(policy: InferencePolicy, query: bytes) -> str | None:
    """A ``model`` query parameter (router mode routes GET requests by it) must be allowed."""
    if not policy.models:
        return None
    for part in query.split(b"&"):
        name, _, value = part.partition(b"=")
        if unquote_plus(name.decode("latin-1")) == "model":
            model = unquote_plus(value.decode("latin-1"))
            if model not in policy.models:
                allowed = ", ".join(sorted(policy.models))
                return f"brokerd refuses model {model!r}{policy.where}: allowed {allowed}"
    return None


def llama_error(status: int, message: str) -> dict[str, dict[str, object]]:
    """llama-server's error envelope, so loopd reads the proxy's refusals like the server's."""
    kinds = {
        400: "invalid_request_error",
        403: "permission_error",
        408: "invalid_request_error",
        413: "invalid_request_error",
        502: "unavailable_error",
        503: "unavailable_error",
    }
    kind = kinds.get(status, "server_error")
    return {"error": {"code": status, "message": message, "type": kind}}


def inference_rules(
    api_key: str | None,
    policy: InferencePolicy | None = None,
    slot_folder: SlotFolder | None = None,
) -> ForwardRules:
    """The inference proxy's rules; ``api_key`` (host config) is sent as a bearer token.
    ``slot_folder``: the server's save folder, where this client's saves are recorded and kept
    under its cap after each save."""
    inject = {b"authorization": b"Bearer " + api_key.encode()} if api_key else {}
    bounds = policy or InferencePolicy()

    def refusal_with_policy(method: str, path: str, query: bytes) -> str | None:
        return refusal(method, path, query) or query_refusal(bounds, query)

    async def check_body(method: str, path: str, _query: bytes, body: bytes) -> Refused | None:
        return body_refusal(bounds, method, path, body)

    async def before_forward(method: str, path: str, query: bytes, body: bytes) -> None:
        if slot_folder is None or not is_slot_action(method, path):
            return
        if action_of(query) == "restore":
            await slot_folder.restoring(str(json.loads(body)["filename"]))
        else:
            await slot_folder.forwarding_save(str(json.loads(body)["filename"]))

    async def after_forward(
        method: str, path: str, query: bytes, body: bytes, status: int | None
    ) -> None:
        if slot_folder is None or not is_slot_action(method, path) or action_of(query) != "save":
            return
        name = str(json.loads(body)["filename"])
        await slot_folder.save_answered(name, succeeded=status == 200)

    return ForwardRules(
        refusal=refusal_with_policy,
        error_body=json_error(llama_error),
        drop_request_headers=DROPPED_REQUEST_HEADERS,
        inject_request_headers=inject,
        check_body=check_body,
        before_forward=before_forward,
        after_forward=after_forward,
    )


def create_inference_app(
    upstream: Upstream,
    *,
    api_key: str | None = None,
    policy: InferencePolicy | None = None,
    body_cap: int = DEFAULT_BODY_CAP,
    bodies: BodyRules | None = None,
    slot_folder: SlotFolder | None = None,
) -> Starlette:
    """The Starlette app served on ``infer.sock`` (or one server's ``infer-NAME.sock``).

    Every request gets a fresh upstream connection. llama-server's router can drop a kept-alive
    connection without answering the next request sent on it (seen when that request came a few
    milliseconds after another client hung up a stream); a reused connection would turn that into
    a 502, which loopd must read as "server gone". A new connection to the host-local server
    costs well under a millisecond, next to seconds of generation.
    """
    proxy = Forwarder(
        upstream,
        inference_rules(api_key, policy, slot_folder),
        body_cap=body_cap_for(body_cap),
        bodies=bodies,
        logger=logger,
        reuse_connections=False,
    )
    return Starlette(
        routes=[Route("/{path:path}", endpoint=proxy)], lifespan=closing_lifespan(proxy.aclose)
    )
