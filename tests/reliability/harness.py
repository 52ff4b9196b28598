"""The running system of a reliability scenario, and the four checks every scenario ends with.

A :class:`Box` is one scenario's world: the fake llama-server on loopback, brokerd's tool broker
on a Unix socket (in-process, or as a ``brokerd serve`` process when the scenario kills it), a
state directory for loopd, and a catalogue with one broker tool, ``mark_ticket``, whose every run
appends its tag to a file: that file is the ground truth of how often a broker tool ran.

loopd itself runs either in-process (:func:`say`, the terminal's turn with short limits) or as
``python -m loopd chat`` (:func:`start_chat`), which is what a scenario kills.

:func:`check_invariants` is the issue's four checks: ``loopd log verify`` passes; every user
message is stored exactly once; no tool ran twice; the user got an answer or a clear message.
"""

from __future__ import annotations

import io
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import anyio
import anyio.abc

from brokerd.tools.app import create_broker_app
from brokerd.tools.settings import BrokerSettings
from loopcommon.jsonbytes import dumps
from loopd.cli.log import verify_log
from loopd.config import Settings
from loopd.engine.limits import Limits
from loopd.engine.outcome import TurnOutcome
from loopd.engine.progress import Status
from loopd.sessionlog.records import EntryKind, fresh_external_key
from loopd.sessionlog.store import SessionLog
from loopd.sessions import Runtime
from loopd_dev.fakes.llama import FakeLlama, ModelSpec, RunningFake, serve_fake_llama
from tests.brokerd.proxy.proxy_support import serving

MODEL = "fake-model"
SESSION = "terminal"
WAIT_S = 30.0
MARK_TOOL = "mark_ticket"

# Short limits for in-process turns, so that a fault ends a scenario in about a second.
FAST = Limits(
    first_byte_s=3.0,
    silence_s=1.0,
    slots_poll_s=0.05,
    probe_timeout_s=0.3,
    loading_wait_s=0.05,
    loading_retry_s=10.0,
    retry_wait_s=0.0,
    status_interval_s=0.0,
)


def mark_tool_toml(marks: Path) -> str:
    """A broker tool with a visible side effect: it appends ``tag`` to ``marks``, then sleeps
    ``wait`` seconds (so a scenario can kill something while it runs)."""
    argv = ["/bin/sh", "-c", 'echo "$1" >> "$2"; sleep "$3"; echo "marked $1"']
    return "\n".join(
        [
            f'name = "{MARK_TOOL}"',
            'description = "Mark a ticket as done: records the ticket tag once."',
            "timeout_s = 60",
            "output_cap_bytes = 4096",
            'approval = "auto"',  # it writes a host file; these scenarios are about crashes
            "",
            "[parameters]",
            'type = "object"',
            'required = ["tag"]',
            "additionalProperties = false",
            "",
            "[parameters.properties.tag]",
            'type = "string"',
            'pattern = "^[a-z0-9-]{1,40}$"',
            "",
            "[parameters.properties.wait]",
            'type = "integer"',
            "minimum = 0",
            "maximum = 30",
            "default = 0",
            "",
            "[run]",
            'kind = "command"',
            f"argv = {json.dumps([*argv, 'sh', '{tag}', str(marks), '{wait}'])}",
            "[confine]",  # command tools run confined: the marks file's folder is writable
            f"read_write = {json.dumps([str(marks.parent)])}",
            "",
        ]
    )


@dataclass
class Box:
    """One scenario's world. Paths are short (Unix socket paths must stay under ~100 bytes)."""

    root: Path
    fake: FakeLlama
    llama: RunningFake
    infer_url: str

    @property
    def state_dir(self) -> Path:
        return self.root / "state"

    @property
    def db_path(self) -> Path:
        return self.state_dir / "loopd.db"

    @property
    def workspaces(self) -> Path:
        return self.root / "ws"

    @property
    def broker_socket(self) -> Path:
        return self.root / "b" / "broker.sock"

    @property
    def audit_db(self) -> Path:
        return self.root / "audit.db"

    @property
    def catalogue(self) -> Path:
        return self.root / "catalogue"

    @property
    def marks(self) -> Path:
        return self.root / "marks.txt"

    def workspace(self, session: str = SESSION) -> Path:
        return self.workspaces / session

    def settings(self, **overrides: Any) -> Settings:
        values: dict[str, Any] = {
            "infer_url": self.infer_url,
            "model": MODEL,
            "state_dir": self.state_dir,
            "workspace_dir": self.workspaces,
            "broker_url": f"unix:{self.broker_socket}",
            "slots": (0,),
            "pin_slots": "yes",  # the fake keeps idle slots, as a self-test would find
            "first_byte_s": FAST.first_byte_s,
            "silence_s": FAST.silence_s,
            "connect_s": 2.0,
            "max_tokens": 512,
            "think_cap": 0,  # no cap: 512 tokens leave a capped reasoning no room to answer
            "log_format": "json",
        }
        values.update(overrides)
        return Settings(**values)

    def env(self, **overrides: str) -> dict[str, str]:
        """The environment of a ``loopd`` process for this box (nothing inherited of LOOPD_*)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LOOPD_", "BROKERD_"))}
        env.update(
            LOOPD_INFER_URL=self.infer_url,
            LOOPD_MODEL=MODEL,
            LOOPD_STATE_DIR=str(self.state_dir),
            LOOPD_WORKSPACE_DIR=str(self.workspaces),
            LOOPD_BROKER_URL=f"unix:{self.broker_socket}",
            LOOPD_SLOTS="0",
            LOOPD_PIN_SLOTS="yes",
            LOOPD_FIRST_BYTE_S="20",
            LOOPD_SILENCE_S="5",
            # The fake's slots hold 8192 tokens; the default max_tokens (12288) would leave a
            # prompt no room, and every tool round would compact first. No cap, as before.
            LOOPD_MAX_TOKENS="4096",
            LOOPD_THINK_CAP="0",
            LOOPD_LOG_FORMAT="json",
        )
        env.update(overrides)
        return env

    def broker_settings(self) -> BrokerSettings:
        return BrokerSettings(audit_db=self.audit_db, catalogue_dir=self.catalogue)

    def mark_lines(self) -> list[str]:
        return self.marks.read_text().split() if self.marks.exists() else []

    def chat_requests(self) -> list[Any]:
        """The fake's records of chat completion requests, in arrival order."""
        return [r for r in self.fake.log if r.path == "/v1/chat/completions"]


def fake_llama(n_ctx: int = 8192) -> FakeLlama:
    return FakeLlama([ModelSpec(MODEL, n_slots=2, n_ctx=n_ctx)])


@asynccontextmanager
async def box(fake: FakeLlama | None = None, *, broker: bool = True) -> AsyncIterator[Box]:
    """The fake llama-server on loopback TCP, brokerd's tool broker in-process (unless
    ``broker`` is False: then nothing listens on the broker socket), in a short temp dir."""
    fake = fake or fake_llama()
    try:
        async with _box(fake, broker) as env:
            yield env
    except BaseExceptionGroup as group:
        # The scenario's own failure (an assert, a broken invariant) should read as itself.
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise


@asynccontextmanager
async def _box(fake: FakeLlama, broker: bool) -> AsyncIterator[Box]:
    with tempfile.TemporaryDirectory(prefix="lr") as tmp:
        root = Path(tmp)
        (root / "b").mkdir(mode=0o750)
        (root / "catalogue").mkdir()
        # On TCP: an in-process turn cancelled while it connects over a Unix socket can trip a
        # race in anyio's connect_unix; the box's own sockets stay Unix sockets.
        async with serve_fake_llama(fake) as llama:
            env = Box(root, fake, llama, llama.base_url)
            env.catalogue.joinpath(f"{MARK_TOOL}.toml").write_text(mark_tool_toml(env.marks))
            if not broker:
                yield env
                return
            async with serving(root / "b", {"broker": create_broker_app(env.broker_settings())}):
                yield env


# -- loopd in-process ------------------------------------------------------------------------------


def _ignore(status: Status) -> None:
    del status


def terminal_text(outcome: TurnOutcome) -> str:
    """What ``loopd chat`` shows for a turn: the answer on stdout, or its one-line message."""
    if outcome.failure is not None:
        return f"loopd: {outcome.failure}"
    return outcome.answer or "(no answer)"


@asynccontextmanager
async def runtime(env: Box, **overrides: Any) -> AsyncIterator[Runtime]:
    rt = Runtime.open(env.settings(**overrides))
    try:
        yield rt
    finally:
        await rt.aclose()


async def say(
    rt: Runtime, text: str, *, session: str = SESSION, limits: Limits = FAST
) -> tuple[str, TurnOutcome]:
    """One terminal line: store the user message, run the turn with ``limits``; the text the
    terminal would show, and the outcome."""
    target = rt.ensure_session(session)
    rt.log.append_user(session, text, external_key=fresh_external_key())
    turn = replace(rt.turn(target, _ignore), limits=limits)
    outcome = await turn.run()
    return terminal_text(outcome), outcome


def limits(**changes: Any) -> Limits:
    return replace(FAST, **changes)


# -- loopd as a process ----------------------------------------------------------------------------


@dataclass
class ChatProcess:
    """A running ``python -m loopd chat``; its stdout and stderr go to files."""

    process: anyio.abc.Process
    stdout: Path
    stderr: Path

    def out(self) -> str:
        return self.stdout.read_text(errors="replace")

    def err(self) -> str:
        return self.stderr.read_text(errors="replace")

    def kill(self) -> None:
        """SIGKILL: nothing in loopd gets to run."""
        self.process.send_signal(signal.SIGKILL)

    async def wait(self, timeout_s: float = WAIT_S) -> int:
        with anyio.fail_after(timeout_s):
            return await self.process.wait()


_runs = iter(range(1_000_000))


async def start_chat(env: Box, lines: Sequence[str] = (), **env_overrides: str) -> ChatProcess:
    """Start ``loopd chat`` on the box's state dir and feed it ``lines`` (then end of input)."""
    n = next(_runs)
    stdout, stderr = env.root / f"chat{n}.out", env.root / f"chat{n}.err"
    with stdout.open("wb") as out, stderr.open("wb") as err:
        process = await anyio.open_process(
            [sys.executable, "-m", "loopd", "chat", "--session", SESSION],
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=err,
            env=env.env(**env_overrides),
        )
    assert process.stdin is not None
    await process.stdin.send("".join(f"{line}\n" for line in lines).encode())
    await process.stdin.aclose()
    return ChatProcess(process, stdout, stderr)


async def chat(env: Box, lines: Sequence[str] = (), **env_overrides: str) -> ChatProcess:
    """``loopd chat`` to its end."""
    proc = await start_chat(env, lines, **env_overrides)
    await proc.wait()
    return proc


async def until(condition: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    """Wait for ``condition``, polled (the fakes and subprocesses offer no event for it)."""
    try:
        with anyio.fail_after(timeout_s):
            while not condition():  # noqa: ASYNC110
                await anyio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


# -- brokerd as a process --------------------------------------------------------------------------


@dataclass
class BrokerProcess:
    process: anyio.abc.Process
    socket: Path

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)

    async def stop(self) -> None:
        if self.process.returncode is None:
            self.kill()
        with anyio.fail_after(WAIT_S):
            await self.process.wait()


async def start_brokerd(env: Box) -> BrokerProcess:
    """``brokerd serve --only broker`` for this box; returns once its socket answers."""
    proc_env = {k: v for k, v in os.environ.items() if not k.startswith(("LOOPD_", "BROKERD_"))}
    proc_env.update(
        BROKERD_SOCKET_DIR=str(env.broker_socket.parent),
        BROKERD_BROKER__AUDIT_DB=str(env.audit_db),
        BROKERD_BROKER__CATALOGUE_DIR=str(env.catalogue),
    )
    log = (env.root / "brokerd.log").open("ab")
    with log:
        process = await anyio.open_process(
            [sys.executable, "-m", "brokerd", "serve", "--only", "broker"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env=proc_env,
        )
    broker = BrokerProcess(process, env.broker_socket)
    await until(lambda: _accepts(env.broker_socket), "brokerd's socket", 20.0)
    return broker


def _accepts(path: Path) -> bool:
    import socket

    if not path.exists():
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        try:
            sock.connect(str(path))
        except OSError:
            return False
    return True


# -- scripted model output -------------------------------------------------------------------------


def call_args(**arguments: Any) -> str:
    return dumps(arguments)


def call_tool_args(name: str, **arguments: Any) -> str:
    return dumps({"name": name, "arguments": arguments})


# -- the four checks -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Checked:
    """What the checks saw, for the scenario's row in docs/reliability.md."""

    sessions: int
    user_messages: int
    tool_runs: int
    output: str

    def summary(self) -> str:
        said = self.output.strip().splitlines()[-1] if self.output.strip() else ""
        return (
            f"verify ok ({self.sessions} session(s)); {self.user_messages} user message(s) "
            f"once each; {self.tool_runs} tool run(s), none twice; showed: {said[:90]}"
        )


class InvariantBroken(AssertionError):
    """One of the four checks failed; the message names which and what was seen."""


# User entries loopd writes itself (compaction's instruction and summary, a message carried into
# a new epoch) are keyed so; they are not messages a user sent.
OWN_KEY_PREFIX = "loopd-"


def user_messages(db_path: Path) -> list[str]:
    """Every message a user sent, as stored in the log: all sessions, in log order."""
    with SessionLog.open(db_path, create=False) as log:
        return [
            json.loads(entry.message)["content"]
            for session in log.sessions()
            for entry in log.entries(session.name)
            if entry.kind is EntryKind.USER
            and entry.message is not None
            and not (entry.fields.external_key or "").startswith(OWN_KEY_PREFIX)
        ]


def audit_runs(audit_db: Path) -> list[tuple[str, str, str]]:
    """(session, call id, tool) of every call brokerd started, from its audit log."""
    if not audit_db.exists():
        return []
    with _readonly(audit_db) as db:
        rows = db.execute("SELECT session, call_id, tool FROM call_started").fetchall()
    return [(str(a), str(b), str(c)) for a, b, c in rows]


@contextmanager
def _readonly(path: Path) -> Iterator[sqlite3.Connection]:
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        yield db
    finally:
        db.close()


def check_invariants(
    state_dir: Path,
    audit_db: Path | None,
    expected_user_messages: Sequence[str],
    output: str,
    *,
    effects: Iterable[Path] = (),
    marks: Path | None = None,
    shows: str | None = None,
) -> Checked:
    """The issue's four checks, with what they saw.

    1. ``loopd log verify`` (the command's own function) passes on the whole log.
    2. The stored user messages are exactly ``expected_user_messages``: none lost, none twice.
    3. No tool ran twice: each line of each ``effects`` file (one line per run of a workspace
       command) and of ``marks`` (the broker tool's runs) is unique, and brokerd ran no more
       broker tools than its audit log shows it started.
    4. ``output`` (what the terminal or thread showed) is an answer or a clear message: not
       empty, no traceback, and containing ``shows`` when given.
    """
    db_path = state_dir / "loopd.db"
    out, err = io.StringIO(), io.StringIO()
    if verify_log(db_path, None, out, err) != 0:
        raise InvariantBroken(f"loopd log verify failed: {err.getvalue().strip()}")
    with SessionLog.open(db_path, create=False) as log:
        sessions = len(log.sessions())
    stored = user_messages(db_path)
    if Counter(stored) != Counter(expected_user_messages):
        raise InvariantBroken(
            f"user messages stored {_short(stored)}, expected each of "
            f"{_short(expected_user_messages)} exactly once"
        )
    runs: list[str] = []
    for path in [*effects, *([marks] if marks is not None else [])]:
        lines = path.read_text().split() if path.exists() else []
        twice = [line for line, n in Counter(lines).items() if n > 1]
        if twice:
            raise InvariantBroken(f"{path.name}: ran more than once: {twice}")
        runs.extend(lines)
    if marks is not None and audit_db is not None:
        started = [run for run in audit_runs(audit_db) if run[2] == MARK_TOOL]
        ran = marks.read_text().split() if marks.exists() else []
        if len(ran) > len(started):
            raise InvariantBroken(f"{MARK_TOOL} ran {len(ran)} times, audit shows {started}")
    if not output.strip():
        raise InvariantBroken("the user was shown nothing: no answer and no message")
    if "Traceback" in output:
        raise InvariantBroken(f"the user was shown a traceback: {output[-500:]}")
    if shows is not None and shows not in output:
        raise InvariantBroken(f"the user was not shown {shows!r}; shown: {output[-500:]!r}")
    return Checked(sessions, len(stored), len(runs), output)


def _short(texts: Iterable[str]) -> str:
    """A list of messages for an error line, each cut to a readable length."""
    return repr([t if len(t) <= 80 else f"{t[:60]}...({len(t)} chars)" for t in texts])
