"""``python -m soak.fakemm``: the fake Mattermost as its own process, seeded for the soak.

The fake of ``loopd_dev`` with the soak's users (each in the team, in ``town-square`` and
``dev``, and in a direct message with the bot), and two read-only routes the run needs:

- ``GET /_soak/log?since=N``: the fake's post log from entry N, each entry stamped with the wall
  time it was logged (latencies are measured from these stamps);
- ``GET /_soak/faults``: how much of each armed fault is left, and how many post edits were
  refused, so the run can tell a fault that fired from one that was only armed.

Prints one JSON line once it listens (the ids the run drives it with), like the fake's own
``__main__``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import uvicorn
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from loopd_dev.fakes.mattermost import EventLog, FakeConfig, FakeMattermost, build_app
from loopd_dev.fakes.mattermost.model import Post
from loopd_dev.fakes.mattermost.server import uvicorn_config
from soak.relay import bind_unix

_PATCH = re.compile(r"^/api/v4/posts/[^/]+/patch$")


class TimedLog(EventLog):
    """The fake's post log, with the wall time of each entry."""

    def __init__(self) -> None:
        super().__init__()
        self.times: list[float] = []

    def record(self, action: str, post: Post) -> None:
        super().record(action, post)
        self.times.append(time.time())


@dataclasses.dataclass
class PatchCounter:
    """Counts post edits asked for while the fake refuses them (``refuse_patches``)."""

    app: ASGIApp
    fake: FakeMattermost
    refused: int = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and self.fake.faults.refused_patches is not None
            and _PATCH.match(scope["path"])
        ):
            self.refused += 1
        await self.app(scope, receive, send)


def seed_world(fake: FakeMattermost, users: list[str]) -> dict[str, Any]:
    world = fake.world
    team = next(iter(world.teams.values()))
    bot = fake.bot
    channels = [world.channel_by_name("town-square"), world.channel_by_name("dev")]
    dms = {}
    for name in users:
        user = fake.add_user(name, teams=[team.name])
        for channel in channels:
            channel.members.add(user.id)
        dms[name] = world.add_direct_channel(user, bot).id
    return {
        "users": {u.username: u.id for u in world.users.values()},
        "channels": {c.name: c.id for c in channels},
        "dms": dms,
        "bot": {"id": bot.id, "username": bot.username},
        "team": team.id,
    }


def build(fake: FakeMattermost, log: TimedLog) -> uvicorn.Config:
    """The fake's app with the soak's routes, behind the patch counter, as uvicorn runs it."""
    app = build_app(fake)

    async def soak_log(request: Request) -> JSONResponse:
        since = int(request.query_params.get("since", "0"))
        entries = [
            {**dataclasses.asdict(entry), "at": at}
            for entry, at in zip(log.entries[since:], log.times[since:], strict=True)
        ]
        return JSONResponse({"entries": entries, "next": since + len(entries)})

    async def soak_faults(request: Request) -> JSONResponse:
        faults = fake.faults
        return JSONResponse(
            {
                "forced_429_left": faults.forced_429,
                "failing_creates_left": faults.failing_creates,
                "refused_patch_requests": counter.refused,
                "refusing": faults.refused_patches,
            }
        )

    app.router.routes.append(Route("/_soak/log", soak_log))
    app.router.routes.append(Route("/_soak/faults", soak_faults))
    counter = PatchCounter(app, fake)
    config = uvicorn_config(app, fake)
    config.app = counter
    return config


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def serve(uds: Path, users: list[str]) -> None:
    fake = FakeMattermost(FakeConfig(bot_token="soak-bot-token"))
    log = TimedLog()
    fake.log = log
    seeded = seed_world(fake, users)
    server = _Server(build(fake, log))
    sock = bind_unix(uds)
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve, [sock])
        while not server.started:  # noqa: ASYNC110 - uvicorn offers no event for it
            await anyio.sleep(0.02)
        print(json.dumps({"uds": str(uds), "bot_token": fake.config.bot_token, **seeded}))
        sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m soak.fakemm")
    parser.add_argument("--uds", type=Path, required=True)
    parser.add_argument("--users", required=True, help="comma list of usernames to add")
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        anyio.run(serve, args.uds, [u for u in args.users.split(",") if u])
    return 0


if __name__ == "__main__":
    sys.exit(main())
