"""REST routes under ``/api/v4``: parse the request, call the fake, shape the response.

Authentication is by ``Authorization: Bearer <token>`` only; anything else is 401, which is how
a test proves that a proxy injected the token. Failures are ``AppError`` JSON bodies, except a
rate-limited request, which gets the real server's plain-text 429.
"""

import secrets
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

from starlette.datastructures import MutableHeaders
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from loopd_dev.fakes.mattermost.core import FakeMattermost
from loopd_dev.fakes.mattermost.errors import AppError, invalid_param, unauthorized
from loopd_dev.fakes.mattermost.model import Patch, User
from loopd_dev.fakes.mattermost.multipart import MultipartError, parse_form_data
from loopd_dev.fakes.mattermost.ws import client_key, token_from_headers

T = TypeVar("T")

DEFAULT_PER_PAGE = 60
MAX_PER_PAGE = 200


def _fake(request: Request) -> FakeMattermost:
    return cast(FakeMattermost, request.app.state.fake)


def _session(request: Request) -> tuple[FakeMattermost, User]:
    fake = _fake(request)
    user = fake.world.user_by_token(token_from_headers(request.headers))
    if user is None:
        raise unauthorized()
    return fake, user


async def _json_object(request: Request, what: str) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError:
        raise invalid_param(what) from None
    if not isinstance(body, dict):
        raise invalid_param(what)
    return body


def _int_param(request: Request, name: str, default: int) -> int:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise invalid_param(name) from None


def _str_field(body: dict[str, Any], name: str) -> str:
    value = body.get(name, "")
    if not isinstance(value, str):
        raise invalid_param(name)
    return value


def _typed(body: dict[str, Any], name: str, kind: type[T]) -> T | None:
    """A patch field: absent means keep; present with the wrong type is a 400."""
    if name not in body or body[name] is None:
        return None
    value = body[name]
    if not isinstance(value, kind):
        raise invalid_param(name)
    return value


# ----- users, channels, system -----


async def ping(request: Request) -> Response:
    return JSONResponse({"status": "OK", "ActiveSearchBackend": "database"})


async def client_config(request: Request) -> Response:
    fake = _fake(request)
    if request.query_params.get("format") != "old":
        raise AppError("api.config.client.old_format.app_error", "format=old is required.", 501)
    version = fake.config.server_version.split(".")
    return JSONResponse(
        {
            "Version": ".".join(version[:3]),
            "BuildNumber": fake.config.server_version,
            "MaxPostSize": str(fake.world.max_post_size),
            "EnableBotAccountCreation": "true",
            "SiteURL": "",
        }
    )


async def get_user(request: Request) -> Response:
    fake, me = _session(request)
    return JSONResponse(fake.world.resolve_user(request.path_params["user_id"], me).to_json())


async def users_by_ids(request: Request) -> Response:
    fake, _ = _session(request)
    try:
        ids = await request.json()
    except ValueError:
        raise invalid_param("user_ids") from None
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise invalid_param("user_ids")
    return JSONResponse([fake.world.users[i].to_json() for i in ids if i in fake.world.users])


def _self_only(fake: FakeMattermost, me: User, path_user_id: str) -> User:
    user = fake.world.resolve_user(path_user_id, me)
    if user.id != me.id:
        raise AppError("api.context.permissions.app_error", "You cannot act as another user.", 403)
    return user


async def user_channels(request: Request) -> Response:
    fake, me = _session(request)
    user = _self_only(fake, me, request.path_params["user_id"])
    return JSONResponse([c.to_json() for c in fake.world.channels_of(user)])


async def user_teams(request: Request) -> Response:
    fake, me = _session(request)
    user = _self_only(fake, me, request.path_params["user_id"])
    return JSONResponse([t.to_json() for t in fake.world.teams_of(user)])


async def login(request: Request) -> Response:
    """``POST /users/login``: a human's username and password; the session token comes back in
    the ``Token`` header (the fake hands out the user's one token)."""
    fake = _fake(request)
    body = await _json_object(request, "login")
    user = fake.world.login(_str_field(body, "login_id"), _str_field(body, "password"))
    return JSONResponse(user.to_json(), headers={"Token": user.token})


async def user_team_channels(request: Request) -> Response:
    fake, me = _session(request)
    user = _self_only(fake, me, request.path_params["user_id"])
    team_id = request.path_params["team_id"]
    channels = [c for c in fake.world.channels_of(user) if c.team_id in (team_id, "")]
    return JSONResponse([c.to_json() for c in channels])


async def channel_members(request: Request) -> Response:
    fake, me = _session(request)
    page = _int_param(request, "page", 0)
    per_page = min(_int_param(request, "per_page", DEFAULT_PER_PAGE), MAX_PER_PAGE)
    if page < 0 or per_page < 0:
        raise invalid_param("page" if page < 0 else "per_page")
    members = fake.world.channel_members(request.path_params["channel_id"], me, page, per_page)
    return JSONResponse(members)


async def get_channel(request: Request) -> Response:
    fake, me = _session(request)
    return JSONResponse(
        fake.world.readable_channel(request.path_params["channel_id"], me).to_json()
    )


async def typing(request: Request) -> Response:
    fake, me = _session(request)
    body = await _json_object(request, "typing")
    fake.typing_for(
        me,
        request.path_params["user_id"],
        _str_field(body, "channel_id"),
        _str_field(body, "parent_id"),
    )
    return JSONResponse({"status": "OK"})


# ----- posts -----


async def create_post(request: Request) -> Response:
    fake, me = _session(request)
    body = await _json_object(request, "post")
    props = body.get("props") or {}
    file_ids = body.get("file_ids") or []
    if not isinstance(props, dict):
        raise invalid_param("props")
    if not isinstance(file_ids, list) or not all(isinstance(f, str) for f in file_ids):
        raise invalid_param("file_ids")
    result = fake.create_post(
        me,
        _str_field(body, "channel_id"),
        _str_field(body, "message"),
        root_id=_str_field(body, "root_id"),
        props=props,
        file_ids=file_ids,
        pending_post_id=_str_field(body, "pending_post_id"),
        in_flight=True,
    )
    if result.created and fake.faults.take_hanging_create():
        # The post is committed and broadcast; the answer never comes. Waiting for the client
        # to hang up (rather than forever) leaves nothing running once it has given up; until
        # then the create is in flight, and a retry of it is answered 500 (pending).
        await _until_disconnected(request)
        fake.world.finish_create(result.post)
        return Response(status_code=499)  # nobody reads it: the client is gone
    if result.created:
        fake.world.finish_create(result.post)
    failure = fake.faults.take_failing_create() if result.created else None
    if failure is not None:
        # The post is committed and broadcast; only the answer is lost (an ambiguous write).
        raise AppError("fake.post.create.after_commit", "Injected failure after commit.", failure)
    return JSONResponse(fake.world.post_json(result.post), status_code=201)


async def _until_disconnected(request: Request) -> None:
    """Until the client closes the connection (the body is already read, so the next
    message the server can receive is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def get_post(request: Request) -> Response:
    fake, me = _session(request)
    post = fake.world.visible_post(request.path_params["post_id"], me)
    return JSONResponse(fake.world.post_json(post))


async def patch_post(request: Request) -> Response:
    fake, me = _session(request)
    body = await _json_object(request, "post")
    patch = Patch(
        message=_typed(body, "message", str),
        props=_typed(body, "props", dict),
        file_ids=_typed(body, "file_ids", list),
        is_pinned=_typed(body, "is_pinned", bool),
        has_reactions=_typed(body, "has_reactions", bool),
    )
    refused = fake.faults.refused_patches
    if refused is not None:
        raise AppError(
            "api.context.permissions.app_error",
            "You do not have the appropriate permissions.",
            refused,
        )
    post = fake.patch_post(me, request.path_params["post_id"], patch)
    return JSONResponse(fake.world.post_json(post))


async def delete_post(request: Request) -> Response:
    fake, me = _session(request)
    fake.delete_post(me, request.path_params["post_id"])
    return JSONResponse({"status": "OK"})


async def post_thread(request: Request) -> Response:
    fake, me = _session(request)
    thread = fake.world.thread(request.path_params["post_id"], me)
    return JSONResponse(thread.to_json(fake.world))


async def channel_posts(request: Request) -> Response:
    """``since`` wins over everything else, then ``after``, then ``before``, then the page."""
    fake, me = _session(request)
    channel = fake.world.member_channel(request.path_params["channel_id"], me)
    since = _int_param(request, "since", 0)
    page = _int_param(request, "page", 0)
    per_page = min(_int_param(request, "per_page", DEFAULT_PER_PAGE), MAX_PER_PAGE)
    if page < 0:
        raise invalid_param("page")
    if per_page < 0:
        raise invalid_param("per_page")
    skip = request.query_params.get("skipFetchThreads") == "true"
    after = request.query_params.get("after", "")
    before = request.query_params.get("before", "")
    world = fake.world
    if since > 0:
        posts = world.posts_since(channel, since)
    elif after:
        posts = world.posts_around(
            channel, after, before=False, page=page, per_page=per_page, skip_threads=skip
        )
    elif before:
        posts = world.posts_around(
            channel, before, before=True, page=page, per_page=per_page, skip_threads=skip
        )
    else:
        posts = world.posts_page(channel, page, per_page, skip_threads=skip)
    return JSONResponse(posts.to_json(world))


# ----- reactions -----


async def add_reaction(request: Request) -> Response:
    fake, me = _session(request)
    body = await _json_object(request, "reaction")
    if _str_field(body, "user_id") != me.id:
        raise AppError("api.context.permissions.app_error", "You cannot react as another.", 403)
    reaction = fake.add_reaction(me, _str_field(body, "post_id"), _str_field(body, "emoji_name"))
    return JSONResponse(reaction.to_json(), status_code=201)


async def remove_reaction(request: Request) -> Response:
    fake, me = _session(request)
    _self_only(fake, me, request.path_params["user_id"])
    fake.remove_reaction(me, request.path_params["post_id"], request.path_params["emoji_name"])
    return JSONResponse({"status": "OK"})


async def post_reactions(request: Request) -> Response:
    fake, me = _session(request)
    reactions = fake.world.reactions_for(request.path_params["post_id"], me)
    return JSONResponse([r.to_json() for r in reactions])


# ----- files -----


async def upload_files(request: Request) -> Response:
    fake, me = _session(request)
    try:
        parts = parse_form_data(request.headers.get("content-type", ""), await request.body())
    except MultipartError as exc:
        raise AppError("api.file.upload_file.read_form.app_error", str(exc), 400) from None
    fields = {p.name: p.content.decode("utf-8", "replace") for p in parts if p.filename is None}
    uploads = [p for p in parts if p.name == "files" and p.filename is not None]
    channel_id = fields.get("channel_id", "")
    if not channel_id:
        raise invalid_param("channel_id")
    if not uploads:
        raise AppError("api.file.upload_file.read_request.app_error", "No files.", 400)
    stored = [
        fake.world.store_file(me, channel_id, p.filename or "file", p.content_type, p.content)
        for p in uploads
    ]
    client_ids = [p.content.decode() for p in parts if p.name == "client_ids"]
    body = {"file_infos": [s.to_json() for s in stored], "client_ids": client_ids}
    return JSONResponse(body, status_code=201)


async def get_file(request: Request) -> Response:
    fake, me = _session(request)
    stored = fake.world.file_for(request.path_params["file_id"], me)
    disposition = f'attachment; filename="{stored.name}"'
    return Response(
        stored.content, media_type=stored.mime_type, headers={"Content-Disposition": disposition}
    )


async def get_file_info(request: Request) -> Response:
    fake, me = _session(request)
    return JSONResponse(fake.world.file_for(request.path_params["file_id"], me).to_json())


async def post_files_info(request: Request) -> Response:
    fake, me = _session(request)
    post = fake.world.visible_post(request.path_params["post_id"], me)
    infos = [fake.world.files[f].to_json() for f in post.file_ids if f in fake.world.files]
    return JSONResponse(infos)


def api_routes() -> list[Route]:
    api = "/api/v4"
    return [
        Route(f"{api}/system/ping", ping),
        Route(f"{api}/config/client", client_config),
        Route(f"{api}/users/ids", users_by_ids, methods=["POST"]),
        Route(f"{api}/users/login", login, methods=["POST"]),
        Route(f"{api}/users/{{user_id}}", get_user),
        Route(f"{api}/users/{{user_id}}/channels", user_channels),
        Route(f"{api}/users/{{user_id}}/teams", user_teams),
        Route(f"{api}/users/{{user_id}}/teams/{{team_id}}/channels", user_team_channels),
        Route(f"{api}/users/{{user_id}}/typing", typing, methods=["POST"]),
        Route(
            f"{api}/users/{{user_id}}/posts/{{post_id}}/reactions/{{emoji_name}}",
            remove_reaction,
            methods=["DELETE"],
        ),
        Route(f"{api}/channels/{{channel_id}}", get_channel),
        Route(f"{api}/channels/{{channel_id}}/posts", channel_posts),
        Route(f"{api}/channels/{{channel_id}}/members", channel_members),
        Route(f"{api}/posts", create_post, methods=["POST"]),
        Route(f"{api}/posts/{{post_id}}", get_post, methods=["GET"]),
        Route(f"{api}/posts/{{post_id}}", delete_post, methods=["DELETE"]),
        Route(f"{api}/posts/{{post_id}}/patch", patch_post, methods=["PUT"]),
        Route(f"{api}/posts/{{post_id}}/thread", post_thread),
        Route(f"{api}/posts/{{post_id}}/reactions", post_reactions),
        Route(f"{api}/posts/{{post_id}}/files/info", post_files_info),
        Route(f"{api}/reactions", add_reaction, methods=["POST"]),
        Route(f"{api}/files", upload_files, methods=["POST"]),
        Route(f"{api}/files/{{file_id}}", get_file),
        Route(f"{api}/files/{{file_id}}/info", get_file_info),
    ]


def _request_id() -> str:
    return secrets.token_hex(13)


async def app_error_response(request: Request, exc: Exception) -> Response:
    error = exc if isinstance(exc, AppError) else AppError("api.unknown", str(exc), 500)
    return JSONResponse(error.body(_request_id()), status_code=error.status_code)


async def http_error_response(request: Request, exc: Exception) -> Response:
    """Unknown routes and methods, as AppErrors (the real router answers JSON, not text)."""
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    error = AppError("api.context.404.app_error", "Sorry, we could not find the page.", status)
    return JSONResponse(error.body(_request_id()), status_code=status)


class RateLimitMiddleware:
    """Counts every ``/api/v4`` HTTP request; refuses with the plain-text 429 of the real
    server and, while the limiter is on, adds the ``X-RateLimit-*`` headers to every answer."""

    def __init__(self, app: ASGIApp, fake: Callable[[], FakeMattermost]) -> None:
        self.app = app
        self.fake = fake

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/api/v4/"):
            await self.app(scope, receive, send)
            return
        decision = self.fake().admit(client_key(scope))
        if not decision.allowed:
            refusal = PlainTextResponse("limit exceeded\n", 429, headers=decision.headers)
            await refusal(scope, receive, send)
            return
        if not decision.headers:
            await self.app(scope, receive, send)
            return
        await self.app(scope, receive, _adding_headers(send, decision.headers))


def _adding_headers(send: Send, extra: dict[str, str]) -> Callable[[Message], Awaitable[None]]:
    async def send_with_headers(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = MutableHeaders(scope=message)
            for name, value in extra.items():
                headers.append(name, value)
        await send(message)

    return send_with_headers
