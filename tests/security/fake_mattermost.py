"""A small Mattermost for the chat proxy's attacks: it answers the calls the proxy forwards or
makes itself, remembers every request it saw, and is served on a Unix socket from a thread (so
a brokerd process can reach it while a plain test talks to brokerd)."""

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.types import ASGIApp
from starlette.websockets import WebSocket


def mm_id(letter: str) -> str:
    return letter * 26


BOT = mm_id("b")
ALICE, CAROL, MALLORY = mm_id("a"), mm_id("k"), mm_id("m")
TEAM, OTHER_TEAM = mm_id("t"), mm_id("o")
TOWN, ELSEWHERE = mm_id("c"), mm_id("e")  # a channel of TEAM, one of OTHER_TEAM
DM_ALICE, DM_MALLORY = mm_id("d"), mm_id("f")
GM_GOOD, GM_BAD = mm_id("g"), mm_id("h")
BOT_POST_TOWN, BOT_POST_ELSEWHERE, ALICE_POST = mm_id("r"), mm_id("p"), mm_id("q")
CHANNELS: dict[str, dict[str, str]] = {
    TOWN: {"id": TOWN, "type": "O", "team_id": TEAM, "name": "town-square"},
    ELSEWHERE: {"id": ELSEWHERE, "type": "O", "team_id": OTHER_TEAM, "name": "town-square"},
    DM_ALICE: {"id": DM_ALICE, "type": "D", "team_id": "", "name": f"{ALICE}__{BOT}"},
    DM_MALLORY: {"id": DM_MALLORY, "type": "D", "team_id": "", "name": f"{BOT}__{MALLORY}"},
    GM_GOOD: {"id": GM_GOOD, "type": "G", "team_id": "", "name": "gm-good"},
    GM_BAD: {"id": GM_BAD, "type": "G", "team_id": "", "name": "gm-bad"},
}
MEMBERS = {GM_GOOD: [BOT, ALICE, CAROL], GM_BAD: [BOT, ALICE, MALLORY]}
POSTS = {
    BOT_POST_TOWN: {"id": BOT_POST_TOWN, "channel_id": TOWN, "user_id": BOT},
    BOT_POST_ELSEWHERE: {"id": BOT_POST_ELSEWHERE, "channel_id": ELSEWHERE, "user_id": BOT},
    ALICE_POST: {"id": ALICE_POST, "channel_id": TOWN, "user_id": ALICE},
}


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class FakeMattermost:
    seen: list[Seen] = field(default_factory=list)
    redirect_websocket: bool = True

    def paths(self, method: str | None = None) -> list[str]:
        return [s.path for s in self.seen if method is None or s.method == method]

    async def rest(self, request: Request) -> Response:
        body = await request.body()
        path = request.url.path
        self.seen.append(Seen(request.method, path, dict(request.headers), body))
        parts = path.removeprefix("/api/v4/").split("/")
        if request.method == "POST" and path == "/api/v4/posts":
            post = json.loads(body)
            return JSONResponse({"id": mm_id("n"), "channel_id": post.get("channel_id")}, 201)
        if parts == ["users", "me"]:
            reply = JSONResponse({"id": BOT, "username": "loopd"})
            reply.set_cookie("MMAUTHTOKEN", "session-of-the-bot")
            return reply
        if parts[0] == "channels" and len(parts) == 2:
            channel = CHANNELS.get(parts[1])
            return JSONResponse(channel) if channel else JSONResponse({}, 404)
        if parts[0] == "channels" and parts[2:] == ["members"]:
            return JSONResponse([{"user_id": user} for user in MEMBERS.get(parts[1], [])])
        if parts[0] == "posts" and len(parts) == 2:
            post = POSTS.get(parts[1])
            return JSONResponse(post) if post else JSONResponse({}, 404)
        return JSONResponse({"path": path})

    async def websocket(self, websocket: WebSocket) -> None:
        self.seen.append(Seen("UPGRADE", websocket.url.path, dict(websocket.headers), b""))
        if websocket.url.path == "/api/v4/websocket" and self.redirect_websocket:
            location = "ws://localhost/api/v4/elsewhere"
            redirect = Response(status_code=302, headers={"Location": location})
            await websocket.send_denial_response(redirect)
            return
        await websocket.accept()
        await websocket.send_text('{"event": "hello"}')
        await websocket.close()

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                WebSocketRoute("/api/v4/websocket", self.websocket),
                WebSocketRoute("/api/v4/elsewhere", self.websocket),
                Route("/{path:path}", self.rest, methods=["GET", "POST", "PUT", "DELETE"]),
            ]
        )


@contextmanager
def served(app: ASGIApp, uds: Path) -> Iterator[Path]:
    """Serve ``app`` on ``uds`` from a thread until the block ends."""
    config = uvicorn.Config(app, uds=str(uds), log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise AssertionError("the fake Mattermost did not start")
        time.sleep(0.02)
    try:
        yield uds
    finally:
        server.should_exit = True
        thread.join(timeout=10)
