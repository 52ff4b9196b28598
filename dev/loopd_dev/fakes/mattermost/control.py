"""The out-of-band control API under ``/_fake``, so a fake in another process can be driven.

Each route maps onto a method of the in-process handle (``FakeMattermost``); arguments travel
as a JSON object of keyword arguments. Only the names listed here can be called.
"""

import dataclasses
from typing import Any, cast

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from loopd_dev.fakes.mattermost.clock import ManualClock
from loopd_dev.fakes.mattermost.core import FakeMattermost
from loopd_dev.fakes.mattermost.errors import AppError
from loopd_dev.fakes.mattermost.model import Channel, Post, Reaction, User

ACTIONS = frozenset(
    {
        "post_as",
        "edit_as",
        "delete_as",
        "react_as",
        "unreact_as",
        "typing_as",
        "emit_noise",
        "add_user",
        "add_group",
    }
)
FAULTS = frozenset(
    {
        "drop_sockets",
        "skip_seq",
        "duplicate_seq",
        "stall",
        "unstall",
        "restart",
        "overflow_send_queue",
        "fail_next_creates",
        "hang_next_creates",
        "refuse_patches",
        "burst_429",
        "set_rate_limit",
        "set_edit_time_limit",
        "set_update_at_skew",
    }
)


def _fake(request: Request) -> FakeMattermost:
    return cast(FakeMattermost, request.app.state.fake)


async def _call(request: Request, allowed: frozenset[str]) -> Response:
    fake = _fake(request)
    name = request.path_params["name"]
    if name not in allowed:
        raise AppError("fake.control.unknown", f"unknown control {name!r}", 404)
    raw = await request.body()
    try:
        kwargs = (await request.json()) if raw else {}
    except ValueError:
        raise AppError("fake.control.body", "the body must be a JSON object", 400) from None
    if not isinstance(kwargs, dict):
        raise AppError("fake.control.body", "the body must be a JSON object", 400)
    try:
        result = getattr(fake, name)(**kwargs)
    except TypeError as exc:  # wrong or missing keyword arguments
        raise AppError("fake.control.arguments", f"{name}: {exc}", 400) from None
    return JSONResponse({"result": _jsonable(fake, result)})


def _jsonable(fake: FakeMattermost, value: Any) -> Any:
    if isinstance(value, Post):
        return fake.world.post_json(value)
    if isinstance(value, Reaction):
        return value.to_json()
    if isinstance(value, User | Channel):
        return value.to_json()
    return value


async def act(request: Request) -> Response:
    return await _call(request, ACTIONS)


async def fault(request: Request) -> Response:
    return await _call(request, FAULTS)


async def state(request: Request) -> Response:
    fake = _fake(request)
    world = fake.world
    return JSONResponse(
        {
            "bot": {**fake.bot.to_json(), "token": fake.bot.token},
            "users": {u.username: {"id": u.id, "token": u.token} for u in world.users.values()},
            "teams": {t.name: t.id for t in world.teams.values()},
            "channels": {c.name: c.id for c in world.channels.values()},
            "restarts": fake.restarts,
            "connections": [
                {"id": c.id, "user_id": c.user_id, "active": c.active, "next_seq": c.next_seq}
                for c in fake.connections()
            ],
        }
    )


async def event_log(request: Request) -> Response:
    return JSONResponse([dataclasses.asdict(e) for e in _fake(request).log.entries])


async def advance_clock(request: Request) -> Response:
    fake = _fake(request)
    if not isinstance(fake.clock, ManualClock):
        raise AppError("fake.clock.not_manual", "this fake runs on the system clock", 400)
    body = await request.json()
    seconds = body.get("seconds") if isinstance(body, dict) else None
    if not isinstance(seconds, int | float) or seconds < 0:
        raise AppError("fake.clock.seconds", "seconds must be a number >= 0", 400)
    fake.clock.advance(float(seconds))
    return JSONResponse({"now_ms": fake.clock.now_ms()})


def control_routes() -> list[Route]:
    return [
        Route("/_fake/state", state),
        Route("/_fake/log", event_log),
        Route("/_fake/act/{name}", act, methods=["POST"]),
        Route("/_fake/faults/{name}", fault, methods=["POST"]),
        Route("/_fake/clock/advance", advance_clock, methods=["POST"]),
    ]
