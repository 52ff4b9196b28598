"""Helpers for the turn-engine tests on the fake llama-server: a served fake with a client, a
session log in a temporary directory, and a Turn over both."""

from __future__ import annotations

import json
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import anyio

from loopcommon.jsonbytes import dumps
from loopd.approvals.call import Asker
from loopd.config import SHORTHAND_ENDPOINT
from loopd.endpoints.server import Server
from loopd.engine.client import InferenceClient
from loopd.engine.limits import Limits
from loopd.engine.progress import Status
from loopd.engine.request import RequestSettings, Sampling, build_body
from loopd.sessionlog.records import EntryKind, Request, fresh_external_key
from loopd.sessionlog.store import SessionLog
from loopd.sessions import Runtime
from loopd.tools.core import ToolResult
from loopd.turn.loop import Turn
from loopd.wire.assemble import ToolCall
from loopd_dev.fakes.llama import FakeLlama, RunningFake, serve_fake_llama

MODEL = "fake-model"
SESSION = "thread-1"
SLOT = 0
SYSTEM_TEXT = "You are a test agent."
TOOLS_TEXT = (
    '[{"type":"function","function":{"name":"read_file","description":"Read a file.",'
    '"parameters":{"type":"object","properties":{"path":{"type":"string"}},'
    '"required":["path"]}}}]'
)

# Short limits, so that a fault ends a test in a fraction of a second without a real-time sleep.
FAST = Limits(
    first_byte_s=5.0,
    silence_s=2.0,
    slots_poll_s=0.01,
    probe_timeout_s=0.3,
    loading_wait_s=0.005,
    retry_wait_s=0.0,
    status_interval_s=0.0,
)


@dataclass
class Served:
    fake: FakeLlama
    running: RunningFake
    client: InferenceClient
    socket: Path

    @property
    def url(self) -> str:
        return self.client.url


@asynccontextmanager
async def served(fake: FakeLlama | None = None) -> AsyncIterator[Served]:
    """``fake`` (a default one if None) on a Unix socket, with loopd's client for it."""
    fake = fake or FakeLlama()
    # A short directory of its own: a Unix socket path must stay under about 100 bytes.
    with tempfile.TemporaryDirectory(prefix="le") as tmp:
        socket = Path(tmp) / "llama.sock"
        async with (
            serve_fake_llama(fake, uds=socket) as running,
            InferenceClient(f"unix:{socket}", MODEL, connect_s=2.0) as client,
        ):
            yield Served(fake, running, client, socket)


def settings(max_tokens: int = 512) -> RequestSettings:
    return RequestSettings(model=MODEL, slot=SLOT, max_tokens=max_tokens, sampling=Sampling())


def user_body(text: str, **extra: Any) -> bytes:
    """A request body for one user message, built as the engine builds it."""
    body = build_body(settings(), "", [dumps({"role": "user", "content": text})])
    if not extra:
        return body
    obj = json.loads(body)
    obj.update(extra)
    return dumps(obj).encode()


def open_log(directory: Path, tools_text: str = TOOLS_TEXT) -> SessionLog:
    """A session log with one session on SLOT and its first epoch."""
    log = SessionLog.open(directory / "loopd.db")
    log.ensure_session(SESSION, SLOT)
    log.start_epoch(SESSION, reason="new session", tools_text=tools_text, system_text=SYSTEM_TEXT)
    return log


def say(log: SessionLog, text: str) -> None:
    log.append_user(SESSION, text, external_key=fresh_external_key())


@dataclass
class FakeTools:
    """A ToolRunner that answers every call from a table and remembers the calls; a tool the
    table does not hold fails, as do the tools named in ``failing``."""

    answers: dict[str, str] = field(default_factory=dict)
    calls: list[ToolCall] = field(default_factory=list)
    failing: frozenset[str] = frozenset()

    async def run(self, session: str, call: ToolCall, asker: Asker | None) -> ToolResult:
        self.calls.append(call)
        if call.name not in self.answers:
            return ToolResult(f"error: no tool {call.name}", ok=False)
        return ToolResult(self.answers[call.name], ok=call.name not in self.failing)


def make_turn(
    server: Served,
    log: SessionLog,
    *,
    limits: Limits = FAST,
    tools: FakeTools | None = None,
    statuses: list[Status] | None = None,
    **overrides: Any,
) -> Turn:
    turn = Turn(
        session=SESSION,
        slot=SLOT,
        client=server.client,
        log=log,
        settings=settings(),
        limits=limits,
        tools=tools,
        report=statuses.append if statuses is not None else (lambda status: None),
    )
    return replace(turn, **overrides)


def kinds(log: SessionLog) -> list[EntryKind]:
    return [entry.kind for entry in log.entries(SESSION)]


def records(log: SessionLog) -> list[Request]:
    return log.requests(SESSION)


async def eventually(check: Callable[[], bool | Awaitable[bool]], seconds: float = 5) -> None:
    """Poll ``check`` until it holds (state changed by another task); fail after ``seconds``."""
    with anyio.fail_after(seconds):
        while True:
            value = check()
            if value if isinstance(value, bool) else await value:
                return
            await anyio.sleep(0.005)


def one_server(runtime: Runtime) -> Server:
    """The one server of a runtime set up with ``LOOPD_INFER_URL`` (the shorthand), as the
    runtime knows it now."""
    return runtime.endpoints.servers[SHORTHAND_ENDPOINT]
