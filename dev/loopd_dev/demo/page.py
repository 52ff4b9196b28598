"""The demo's chat page: one channel of the fake Mattermost, as a person sees it in a browser.

The page is served by the fake itself (same origin), and talks to the fake's own REST API and
WebSocket as that person, the way Mattermost's web app does: posts as they are written and
edited (loopd's answer post grows as the model writes), a composer, and the reactions loopd
acts on. Everything here is configuration; the page's behaviour is ``static/app.js``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from loopd.chatsettings import ChatSettings
from loopd_dev.fakes.mattermost.core import FakeMattermost

STATIC = Path(__file__).parent / "static"
_CONFIG_MARK = "__DEMO_CONFIG__"


@dataclass(frozen=True)
class Reaction:
    """One reaction button: Mattermost's emoji name, what it looks like, what it does."""

    emoji: str
    glyph: str
    meaning: str


def reactions(chat: ChatSettings) -> tuple[Reaction, ...]:
    """The reactions loopd acts on, under the names loopd's settings give them."""
    return (
        Reaction(chat.allow_reaction, "✅", "allow the tool call"),
        Reaction(chat.deny_reaction, "❌", "deny the tool call"),
        Reaction(chat.stop_reaction, "🛑", "stop this answer"),
        Reaction(chat.retry_reaction, "🔁", "answer again"),
    )


@dataclass(frozen=True)
class PageOptions:
    """Whom the page acts as, where, and where loopd's status page is (None: not served)."""

    person: str = "alice"
    channel: str = "dev"
    status_url: str | None = None
    chat: ChatSettings = field(default_factory=ChatSettings)


def page_config(fake: FakeMattermost, options: PageOptions) -> dict[str, Any]:
    """What the page's script needs: the person (and the token it acts with), the channel, the
    bot, every user's name, the reactions, and the status page's address."""
    person = fake.user(options.person)
    channel = fake.channel(options.channel)
    bot = fake.bot
    return {
        "person": {"id": person.id, "username": person.username, "token": person.token},
        "channel": {"id": channel.id, "name": channel.name},
        "bot": {"id": bot.id, "username": bot.username},
        "users": {user.id: user.username for user in fake.world.users.values()},
        "reactions": [
            {"emoji": r.emoji, "glyph": r.glyph, "meaning": r.meaning}
            for r in reactions(options.chat)
        ],
        "status_url": options.status_url,
    }


def script_json(value: object) -> str:
    """JSON that is safe inside an HTML ``<script>`` element: no ``</script>``, no ``<!--``."""
    return json.dumps(value).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def render_index(template: str, config: dict[str, Any]) -> str:
    if template.count(_CONFIG_MARK) != 1:
        raise ValueError(f"the page template must hold {_CONFIG_MARK} once")
    return template.replace(_CONFIG_MARK, script_json(config))


def page_routes(options: PageOptions) -> list[BaseRoute]:
    """``/`` (the page) and ``/demo/`` (its script and style), beside the fake's own routes."""
    template = (STATIC / "index.html").read_text(encoding="utf-8")

    async def index(request: Request) -> Response:
        fake: FakeMattermost = request.app.state.fake
        return HTMLResponse(
            render_index(template, page_config(fake, options)),
            headers={"Cache-Control": "no-store"},
        )

    return [
        Route("/", index),
        Mount("/demo", StaticFiles(directory=STATIC), name="demo"),
    ]
