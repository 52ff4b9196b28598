"""The routes of the fake, and the outer ASGI layer that applies server-wide faults.

Router mode selects a model by the body's ``model`` on POSTs and by ``?model=`` on GETs, with
the real 400s. ``/_fake/*`` routes drive the fake from outside (a subprocess fake, a shell) and
are never affected by faults.
"""

from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .asgi import Receive, Scope, Send, json_bytes, read_body, send_json
from .chat import ChatCompletions
from .engine import Pace
from .errors import ApiError, invalid_request, loading_model, not_found
from .faults import Faults
from .messages import parse_chat_request, parse_json_body
from .model import ScriptedReply
from .render import render_prompt, template_source
from .state import FakeLlama, ModelInstance
from .tokenize import token_id, tokenize

_NEVER_BLOCKED_BY_SLEEP = ("/health", "/v1/health", "/props", "/models", "/v1/models", "/metrics")


def json_response(value: Any, status: int = 200) -> Response:
    return Response(json_bytes(value), status, media_type="application/json; charset=utf-8")


class FakeLlamaApp:
    """The ASGI app: records each request, applies hang/loading faults, and can abort everything."""

    def __init__(self, fake: FakeLlama) -> None:
        self.fake = fake
        self._routes = _build_starlette(fake)
        self._in_flight: set[anyio.CancelScope] = set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        with anyio.CancelScope() as cancel_scope:
            self._in_flight.add(cancel_scope)
            try:
                await self._handle(scope, receive, send)
            finally:
                self._in_flight.discard(cancel_scope)

    def abort_all(self) -> None:
        """Cancel every request in progress (the server is going away)."""
        for cancel_scope in list(self._in_flight):
            cancel_scope.cancel()

    async def _handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        send = _with_server_header(send)
        path: str = scope["path"]
        if path.startswith("/_fake/"):
            await self._routes(scope, receive, send)
            return
        body = await read_body(receive)
        record = self.fake.record(scope["method"], path, _loggable(body))
        scope["fake_record"] = record
        send = _recording_status(send, record)
        board = self.fake.faults
        await board.wait_until(lambda f: not f.hang_all)
        if board.faults.loading:
            record.outcome = "error"
            await send_json(send, 503, loading_model().envelope())
            return
        if path not in _NEVER_BLOCKED_BY_SLEEP:
            await board.wait_until(lambda f: not f.sleeping)
        await self._routes(scope, _replay(body, receive), send)
        if record.outcome == "pending":
            record.outcome = "ok" if (record.status or 500) < 400 else "error"


def _loggable(body: bytes) -> Any:
    if not body:
        return None
    try:
        return parse_json_body(body)
    except ApiError:
        return body.decode(errors="replace")


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive that hands the already-read body over once, then waits for the disconnect."""
    sent = False

    async def replay() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return dict(await receive())

    return replay


def _with_server_header(send: Send) -> Send:
    async def wrapped(message: Any) -> None:
        if message["type"] == "http.response.start":
            message["headers"] = [(b"server", b"llama.cpp"), *message.get("headers", [])]
        await send(message)

    return wrapped


def _recording_status(send: Send, record: Any) -> Send:
    async def wrapped(message: Any) -> None:
        if message["type"] == "http.response.start":
            record.status = message["status"]
        await send(message)

    return wrapped


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return json_response(exc.envelope(), exc.status)


async def _http_error(request: Request, exc: Exception) -> Response:
    # Unknown paths and wrong methods both read as "File Not Found", as the real server answers.
    return json_response(not_found().envelope(), 404)


def _build_starlette(fake: FakeLlama) -> Starlette:
    routes = _Routes(fake)
    chat = ChatCompletions(fake)
    return Starlette(
        routes=[
            Route("/health", routes.health),
            Route("/v1/health", routes.health),
            Route("/props", routes.props),
            Route("/slots", routes.slots),
            Route("/models", routes.models),
            Route("/v1/models", routes.models),
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/chat/completions", chat, methods=["POST"]),
            Route("/v1/chat/completions/control", routes.control, methods=["POST"]),
            Route("/apply-template", routes.apply_template, methods=["POST"]),
            Route("/tokenize", routes.post_tokenize, methods=["POST"]),
            Route("/_fake/faults", routes.faults, methods=["GET", "POST"]),
            Route("/_fake/script", routes.script, methods=["POST"]),
            Route("/_fake/pace", routes.pace, methods=["GET", "POST"]),
            Route("/_fake/log", routes.log),
            Route("/_fake/reset", routes.reset, methods=["POST"]),
            Route("/_fake/die", routes.die, methods=["POST"]),
        ],
        exception_handlers={ApiError: _api_error, HTTPException: _http_error},
    )


class _Routes:
    def __init__(self, fake: FakeLlama) -> None:
        self.fake = fake

    async def health(self, request: Request) -> Response:
        return json_response({"status": "ok"})

    async def props(self, request: Request) -> Response:
        if self.fake.router and "model" not in request.query_params:
            return json_response(self._router_props())
        instance = self.fake.select_for_get(dict(request.query_params))
        return json_response(self._model_props(instance))

    async def slots(self, request: Request) -> Response:
        instance = self.fake.select_for_get(dict(request.query_params))
        await self.fake.faults.wait_until(lambda f: not f.slots_hang)
        slots = instance.slots.slots
        if request.query_params.get("fail_on_no_slot") == "1" and all(
            s.is_processing for s in slots
        ):
            raise ApiError(503, "no slot available")
        return json_response([slot.to_json() for slot in slots])

    async def models(self, request: Request) -> Response:
        if self.fake.router:
            return json_response(
                {
                    "data": [self._router_model(m) for m in self.fake.models.values()],
                    "object": "list",
                }
            )
        instance = self.fake.model()
        return json_response(self._single_models(instance))

    async def control(self, request: Request) -> Response:
        body = await _json_object(request)
        instance = self._select_for_post(body)
        completion_id = body.get("id")
        if not isinstance(completion_id, str) or not completion_id:
            raise invalid_request("missing completion id")
        if body.get("action") != "reasoning_end":
            raise invalid_request("unknown control action")
        await self._round_trip(instance, completion_id)
        live = instance.live.get(completion_id)  # a completion that ended meanwhile is gone
        if live is None:
            return json_response({"success": False, "message": "no active completion for this id"})
        if not live.armed:
            return json_response(
                {
                    "success": False,
                    "message": "reasoning control not enabled for this completion",
                }
            )
        live.generation.request_reasoning_end()
        return json_response({"success": True})

    async def _round_trip(self, instance: ModelInstance, completion_id: str) -> None:
        """Hold the control call while its completion writes ``control_round_trip`` tokens."""
        live = instance.live.get(completion_id)
        trip = self.fake.faults.faults.control_round_trip
        if live is None or not trip:
            return
        arrived = anyio.Event()
        live.generation.when_written(trip, arrived.set)
        await arrived.wait()

    async def apply_template(self, request: Request) -> Response:
        body = await _json_object(request)
        instance = self._select_for_post(body)
        chat = parse_chat_request(body)
        prompt = render_prompt(chat.messages, chat.tools, instance.spec.template)
        return json_response({"prompt": prompt})

    async def post_tokenize(self, request: Request) -> Response:
        body = await _json_object(request)
        self._select_for_post(body)
        parse_special = body.get("parse_special", True) is not False
        pieces: list[str | int] = []
        content = body.get("content", "")
        for part in content if isinstance(content, list) else [content]:
            if isinstance(part, int):
                pieces.append(part)
            elif isinstance(part, str):
                pieces.extend(tokenize(part, parse_special=parse_special))
        ids = [p if isinstance(p, int) else token_id(p, special=parse_special) for p in pieces]
        if body.get("with_pieces") is True:
            tokens: list[Any] = [
                {"id": i, "piece": p if isinstance(p, str) else ""}
                for i, p in zip(ids, pieces, strict=True)
            ]
            return json_response({"tokens": tokens})
        return json_response({"tokens": ids})

    async def faults(self, request: Request) -> Response:
        board = self.fake.faults
        if request.method == "POST":
            body = await _json_object(request)
            try:
                board.set(**body)
            except ValueError as exc:
                raise invalid_request(str(exc)) from exc
        return json_response(board.faults.to_json())

    async def script(self, request: Request) -> Response:
        body = await _json_object(request)
        try:
            replies = [ScriptedReply.from_json(r) for r in body.get("replies", [])]
            self.fake.push(*replies, model=body.get("model"))
        except (ValueError, KeyError, TypeError) as exc:
            raise invalid_request(f"bad script: {exc}") from exc
        return json_response({"pending": self.fake.model(body.get("model")).script.pending})

    async def pace(self, request: Request) -> Response:
        pace = self.fake.pace
        if request.method == "POST":
            body = await _json_object(request)
            try:
                self.fake.pace = Pace(**{**pace.__dict__, **body})
            except TypeError as exc:
                raise invalid_request(f"bad pace: {exc}") from exc
        return json_response(self.fake.pace.__dict__)

    async def log(self, request: Request) -> Response:
        return json_response([entry.to_json() for entry in self.fake.log])

    async def reset(self, request: Request) -> Response:
        self.fake.faults.clear()
        for instance in self.fake.models.values():
            instance.script.clear()
        return json_response(Faults().to_json())

    async def die(self, request: Request) -> Response:
        if self.fake.on_die is None:
            raise ApiError(501, "this fake is not running under a server that can die")
        on_die = self.fake.on_die

        async def die_after_answering() -> None:
            on_die()

        response = json_response({"success": True})
        response.background = BackgroundTask(die_after_answering)
        return response

    def _select_for_post(self, body: dict[str, Any]) -> ModelInstance:
        model = body.get("model")
        return self.fake.select(model if isinstance(model, str) else None)

    def _router_props(self) -> dict[str, Any]:
        return {
            "role": "router",
            "max_instances": 4,
            "models_autoload": True,
            "model_alias": "llama-server",
            "model_path": "none",
            "default_generation_settings": {"params": {}, "n_ctx": 0},
            "ui_settings": {},
            "build_info": self.fake.build_info,
            "cors_proxy_enabled": False,
        }

    def _model_props(self, instance: ModelInstance) -> dict[str, Any]:
        spec = instance.spec
        return {
            "default_generation_settings": {"params": _default_params(), "n_ctx": spec.n_ctx},
            "total_slots": spec.n_slots,
            "model_alias": spec.name,
            "model_ftype": "Q4_K - Medium",
            "model_path": f"/models/{spec.name}.gguf",
            "modalities": {"vision": False, "video": False, "audio": False},
            "media_marker": "<__media__>",
            "endpoint_slots": True,
            "endpoint_props": False,
            "endpoint_metrics": False,
            "ui": True,
            "ui_settings": {},
            "chat_template": template_source(spec.template),
            "chat_template_caps": {
                "supports_tools": True,
                "supports_tool_calls": True,
                "supports_parallel_tool_calls": True,
                "supports_system_role": True,
                "supports_preserve_reasoning": not spec.template.drop_past_reasoning,
                "supports_reasoning_effort": False,
                "supports_string_content": True,
                "supports_typed_content": False,
                "supports_object_arguments": True,
            },
            "bos_token": "",
            "eos_token": "<|im_end|>",
            "build_info": self.fake.build_info,
            "is_sleeping": self.fake.faults.faults.sleeping,
            "cors_proxy_enabled": False,
        }

    def _router_model(self, instance: ModelInstance) -> dict[str, Any]:
        return {
            "id": instance.name,
            "aliases": [],
            "tags": [],
            "object": "model",
            "owned_by": "llamacpp",
            "created": instance.created,
            "status": {
                "value": "loaded" if instance.loaded else "unloaded",
                "args": [
                    "--ctx-size",
                    str(instance.spec.n_ctx),
                    "--parallel",
                    str(instance.spec.n_slots),
                ],
                "preset": instance.name,
            },
            "architecture": {"input_modalities": ["text"], "output_modalities": ["text"]},
            "source": "preset",
            "can_remove": False,
        }

    def _single_models(self, instance: ModelInstance) -> dict[str, Any]:
        name = instance.name
        return {
            "models": [
                {
                    "name": name,
                    "model": name,
                    "modified_at": "",
                    "size": "",
                    "digest": "",
                    "type": "model",
                    "description": "",
                    "tags": [""],
                    "capabilities": ["completion"],
                    "parameters": "",
                    "details": {"format": "gguf", "family": "", "families": [""]},
                }
            ],
            "object": "list",
            "data": [
                {
                    "id": name,
                    "aliases": [],
                    "tags": [],
                    "object": "model",
                    "architecture": {"input_modalities": ["text"], "output_modalities": ["text"]},
                    "created": instance.created,
                    "owned_by": "llamacpp",
                    "meta": {
                        "vocab_type": 2,
                        "n_vocab": 49152,
                        "n_ctx": instance.spec.n_ctx * instance.spec.n_slots,
                        "n_ctx_train": instance.spec.n_ctx * instance.spec.n_slots,
                        "n_embd": 576,
                        "n_params": 134515008,
                        "size": 85000000,
                        "ftype": "Q4_K - Medium",
                    },
                }
            ],
        }


def _default_params() -> dict[str, Any]:
    return {
        "seed": 4294967295,
        "temperature": 0.8,
        "top_k": 40,
        "top_p": 0.95,
        "min_p": 0.05,
        "max_tokens": -1,
        "n_predict": -1,
        "stream": False,
        "chat_format": "peg-native",
        "reasoning_format": "auto",
        "reasoning_in_content": False,
        "generation_prompt": "<|im_start|>assistant\n",
        "timings_per_token": False,
    }


async def _json_object(request: Request) -> dict[str, Any]:
    body = parse_json_body(await request.body())
    if not isinstance(body, dict):
        raise invalid_request("[json.exception.type_error.302] type must be object")
    return body
