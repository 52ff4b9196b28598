"""``loopd serve`` as a child process, for tests that kill it for real (SIGKILL) and start it
again on the same state directory.

The in-process ``daemon()`` of chat_support can only cancel the daemon, which runs its cleanup
(the status post says "interrupted", the engine records the cut). A SIGKILL runs nothing: only
what was already committed to the databases and to Mattermost survives, as after a power cut.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import Process

from loopd.chatsettings import ChatSettings
from loopd.config import Settings
from loopd.sessionlog.store import SessionLog
from loopd.sessionlog.verify import verify
from tests.chat.chat_support import Env, until

SERVE = (sys.executable, "-m", "loopd", "serve", "--skip-selftest")
REPO_ROOT = Path(__file__).resolve().parents[2]
READY_S = 60.0  # interpreter start and imports on a loaded two-core machine
KEEP = frozenset({"LOOPDEV_CACHE_DIR"})  # where the real llama-server and its model are built


def _env_value(value: Any) -> str:
    if isinstance(value, bool):  # before int: bool is an int
        return "true" if value else "false"
    if isinstance(value, tuple | list):
        return ",".join(str(v) for v in value)
    return str(value)  # str, int, float, Path


def settings_environment(prefix: str, values: Mapping[str, Any]) -> dict[str, str]:
    """``<PREFIX><FIELD>`` variables for a settings model's ``model_dump()``; None is left out
    (the field's default, None, applies)."""
    return {
        f"{prefix}{name.upper()}": _env_value(value)
        for name, value in values.items()
        if value is not None
    }


def serve_environment(settings: Settings, chat: ChatSettings) -> dict[str, str]:
    """This process's environment without its own LOOPD_* knobs (a developer's LOOPD_CONFIG or
    LOOPD_STATE_DIR must not leak into the child), then exactly the given settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPD_") or k in KEEP}
    env.update(settings_environment("LOOPD_", settings.model_dump(exclude={"mm", "approval"})))
    env.update(settings_environment("LOOPD_APPROVAL_", settings.approval.model_dump()))
    env.update(settings_environment("LOOPD_MM_", chat.model_dump()))
    env["LOOPD_LOG_FORMAT"] = "json"  # stderr is a file: one parseable object per line
    return env


@dataclass
class ServeProcess:
    """One ``loopd serve`` child; its stdout and stderr go to ``log_path``."""

    name: str
    process: Process
    log_path: Path

    @property
    def exited(self) -> bool:
        return self.process.returncode is not None

    def stderr_text(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def log_messages(self) -> list[str]:
        """The ``msg`` of every JSON log line (a traceback's lines are not JSON: skipped)."""
        messages = []
        for line in self.stderr_text().splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and isinstance(record.get("msg"), str):
                messages.append(record["msg"])
        return messages

    def _died(self, what: str) -> AssertionError:
        return AssertionError(
            f"loopd serve ({self.name}) exited with {self.process.returncode} while waiting for "
            f"{what}:\n{self.stderr_text()}"
        )

    async def until(self, condition: Callable[[], bool], what: str, timeout_s: float) -> None:
        """``until``, failing at once (with the daemon's stderr) if the daemon exits."""

        def met() -> bool:
            if self.exited:
                raise self._died(what)
            return condition()

        await until(met, what, timeout_s)

    async def kill(self) -> None:
        """SIGKILL, and reap it: no handler, no cleanup, nothing flushed."""
        os.kill(self.process.pid, signal.SIGKILL)
        with anyio.fail_after(10):
            await self.process.wait()
        assert self.process.returncode == -signal.SIGKILL, self.process.returncode


def bot_connected(env: Env) -> bool:
    """The bot has a live WebSocket on the fake (an old one, once cut, goes inactive)."""
    return any(c.active for c in env.fake.connections(env.fake.config.bot_username))


@asynccontextmanager
async def loopd_serve(env: Env, log_dir: Path, name: str) -> AsyncIterator[ServeProcess]:
    """``loopd serve`` on ``env``'s settings, ready once its socket is up; killed on exit.

    Ready means more than started: the daemon connects only after ``resume_all`` (delivering what
    a crash left unposted, waking pending turns), so a live socket proves that much ran."""
    # A killed daemon's socket must be seen closed first, or it would pass for the new one's.
    await until(lambda: not bot_connected(env), "the previous daemon's socket to close")
    log_path = log_dir / f"loopd-serve-{name}.log"
    with log_path.open("wb") as log_file:
        process = await anyio.open_process(
            SERVE,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=log_file,
            cwd=REPO_ROOT,
            env=serve_environment(env.settings, env.chat),
        )
    running = ServeProcess(name, process, log_path)
    try:
        await running.until(lambda: bot_connected(env), f"{name} to connect", READY_S)
        yield running
    finally:
        if not running.exited:
            process.kill()
        with anyio.CancelScope(shield=True), anyio.fail_after(10):
            await process.aclose()
        # Shown by pytest only when the test fails: what the daemon said.
        print(f"----- loopd serve ({name}) stderr -----\n{running.stderr_text()}")


def verify_session_log(settings: Settings) -> list[str]:
    """``loopd log verify`` on every session: the problems found, as text."""
    with SessionLog.open(settings.db_path, create=False) as log:
        return [str(problem) for problem in verify(log)]
