"""``python -m loopd_dev.fakes.mattermost``: run the fake until interrupted.

Prints one JSON line on stdout once it listens: ``{"base_url", "uds", "bot_token", "users",
"channels"}``, so a parent process can read where it is and whom to act as.
"""

import argparse
import contextlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import anyio
from starlette.routing import BaseRoute

from loopd_dev.fakes.mattermost.clock import ManualClock, SystemClock
from loopd_dev.fakes.mattermost.core import FakeConfig
from loopd_dev.fakes.mattermost.server import serve_fake_mattermost


def parser(prog: str = "python -m loopd_dev.fakes.mattermost") -> argparse.ArgumentParser:
    """The fake's options (``loopd_dev.demo`` adds its own to them)."""
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="TCP port (default 0: a free one)")
    parser.add_argument("--uds", type=Path, help="listen on this Unix socket instead of TCP")
    parser.add_argument("--bot-username", default="loopd")
    parser.add_argument("--bot-token", default="fake-bot-token")
    parser.add_argument("--reaper-timeout", type=float, default=300.0, help="seconds")
    parser.add_argument("--auth-timeout", type=float, default=5.0, help="seconds")
    parser.add_argument("--manual-clock", action="store_true", help="time moves via /_fake")
    return parser


async def run(args: argparse.Namespace, extra_routes: Sequence[BaseRoute] = ()) -> None:
    """Serve the fake (and ``extra_routes`` beside it) until cancelled; say where, once."""
    config = FakeConfig(
        bot_username=args.bot_username,
        bot_token=args.bot_token,
        reaper_timeout_s=args.reaper_timeout,
        auth_timeout_s=args.auth_timeout,
    )
    clock = ManualClock() if args.manual_clock else SystemClock()
    async with (
        anyio.create_task_group() as tg,
        serve_fake_mattermost(
            tg,
            config=config,
            clock=clock,
            uds=args.uds,
            host=args.host,
            port=args.port,
            extra_routes=extra_routes,
        ) as running,
    ):
        world = running.fake.world
        announcement = {
            "base_url": running.base_url,
            "uds": str(running.uds) if running.uds else None,
            "bot_token": config.bot_token,
            "users": {u.username: u.id for u in world.users.values()},
            "channels": {c.name: c.id for c in world.channels.values()},
        }
        sys.stdout.write(json.dumps(announcement) + "\n")
        sys.stdout.flush()
        await anyio.sleep_forever()


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    with contextlib.suppress(KeyboardInterrupt):
        anyio.run(run, args)


if __name__ == "__main__":
    main()
