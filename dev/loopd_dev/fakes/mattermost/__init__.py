"""A faithful fake Mattermost server: REST under ``/api/v4``, the WebSocket with seq and resume,
fault switches, and a control API, built from ``reference/mattermost.md``.

In process::

    async with anyio.create_task_group() as tg:
        async with serve_fake_mattermost(tg, clock=ManualClock()) as running:
            running.fake.post_as("alice", "dev", "@loopd hello")

Out of process: ``python -m loopd_dev.fakes.mattermost --port 0`` prints its address and state as
one JSON line, and is driven over HTTP under ``/_fake``.
"""

from loopd_dev.fakes.mattermost.clock import Clock, ManualClock, SystemClock
from loopd_dev.fakes.mattermost.core import EventLog, FakeConfig, FakeMattermost, LoggedPost
from loopd_dev.fakes.mattermost.errors import AppError
from loopd_dev.fakes.mattermost.hub import Outcome
from loopd_dev.fakes.mattermost.server import RunningFake, build_app, serve_fake_mattermost

__all__ = [
    "AppError",
    "Clock",
    "EventLog",
    "FakeConfig",
    "FakeMattermost",
    "LoggedPost",
    "ManualClock",
    "Outcome",
    "RunningFake",
    "SystemClock",
    "build_app",
    "serve_fake_mattermost",
]
