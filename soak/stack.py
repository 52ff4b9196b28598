"""The system under test, brought up as separate processes and taken down again.

llama-server (router mode, two slots), the fake Mattermost (``soak.fakemm``), the inference relay
(``soak.relay``, in this process: it is the run's own instrument), brokerd with its three sockets
and ``loopd serve``, the last two under ``procs.Supervised`` (restarted 1 s after any exit).
Paths stay short: a Unix socket path must fit in about 100 bytes.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import Process, TaskGroup

from loopd_dev import devserver
from soak.mattermost import FakeControl, bot_connected
from soak.procs import Supervised, descendants_of, end_process
from soak.relay import Relay, StreamFaults, serve_relay
from soak.script import MARK_TOOL, mark_tool_toml
from soak.users import World

REPO_ROOT = Path(__file__).resolve().parents[1]
STATE_FS_MIB = 64
READY_S = 180.0  # loopd's start on a loaded machine: imports, the self-test, the first connect
# LOOPD_SILENCE_S: a stream silent this long is closed. Not lower: llama-server sends no progress
# while it reads a prompt batch, which on a loaded two-core machine can take many seconds.
SILENCE_S = 30.0


class SoakError(RuntimeError):
    """The stack could not be brought up; the message says which part and why."""


@dataclass
class Paths:
    root: Path

    def __post_init__(self) -> None:
        for sub in ("llama", "run", "state", "logs", "catalogue", "marks", "saves"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        (self.root / "run").chmod(0o750)

    @property
    def state(self) -> Path:
        return self.root / "state"

    @property
    def run(self) -> Path:
        return self.root / "run"

    @property
    def marks(self) -> Path:
        return self.root / "marks" / "marks.txt"

    @property
    def audit(self) -> Path:
        return self.root / "audit.db"

    @property
    def saves(self) -> Path:
        """The server's ``--slot-save-path`` folder, which brokerd keeps under its cap."""
        return self.root / "saves"

    @property
    def router_socket(self) -> Path:
        return self.root / "llama" / "llama.sock"

    def log(self, name: str) -> Path:
        return self.root / "logs" / f"{name}.log"


def base_env(**extra: str) -> dict[str, str]:
    """This process's environment without any LOOPD_* or BROKERD_* knob of the caller's (the
    build cache excepted), the repository importable, and ``extra``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("LOOPD_", "BROKERD_")) or k == "LOOPDEV_CACHE_DIR"
    }
    env["PYTHONPATH"] = str(REPO_ROOT)
    env.update(extra)
    return env


def loopd_env(paths: Paths, durable: bool) -> dict[str, str]:
    return base_env(
        # Durable sessions on or off without asking the self-test, so that a run compares the
        # two whatever the probe found (the report says which loopd said it ran with).
        LOOPD_DURABLE="on" if durable else "off",
        LOOPD_INFER_URL=f"unix:{paths.run}/infer.sock",
        LOOPD_MODEL=devserver.PLAIN_MODEL,
        LOOPD_STATE_DIR=str(paths.state),
        LOOPD_BROKER_URL=f"unix:{paths.run}/broker.sock",
        LOOPD_SLOTS="0,1",
        LOOPD_FIRST_BYTE_S="120",
        LOOPD_SILENCE_S=str(SILENCE_S),
        # Short answers: the tiny model's text does not matter here, its turns do; on a two-core
        # machine other work shares, a generated token can cost a slot most of a second.
        LOOPD_MAX_TOKENS="12",
        LOOPD_THINK_CAP="0",  # the plain model does not think; a cap needs room above it
        # The plain template renders no tools, so a prompt is small: the long threads compact
        # after a few of their long messages only below a fifth of the slot's 4096 tokens.
        LOOPD_COMPACT_AT="0.2",
        LOOPD_SUMMARY_MAX_TOKENS="48",
        LOOPD_LOG_FORMAT="json",
        LOOPD_MM_URL=f"unix:{paths.run}/chat.sock",
        LOOPD_MM_ALLOWED_USERS="*",
        LOOPD_MM_ALLOWED_TEAMS="*",
        LOOPD_MM_PING_INTERVAL_S="10",
        LOOPD_MM_BACKOFF_S="1",
        LOOPD_MM_RETRY_FOR_S="60",
    )


def brokerd_env(
    paths: Paths, relay_sock: Path, mm_sock: Path, token_file: Path, save_cap_bytes: int
) -> dict[str, str]:
    return base_env(
        BROKERD_SLOT_SAVE_DIRS=json.dumps([str(paths.saves)]),
        BROKERD_SLOT_SAVE_MAX_BYTES=str(save_cap_bytes),
        BROKERD_SOCKET_DIR=str(paths.run),
        BROKERD_INFERENCE_URL=f"unix:{relay_sock}",
        BROKERD_MATTERMOST_URL=f"unix:{mm_sock}",
        BROKERD_MATTERMOST_TOKEN_FILE=str(token_file),
        # pydantic-settings reads a list from the environment as JSON.
        BROKERD_CHAT_ALLOWED_TEAMS='["*"]',
        BROKERD_CHAT_ALLOWED_CHANNELS='["*"]',
        BROKERD_CHAT_ALLOWED_USERS='["*"]',
        BROKERD_BROKER__AUDIT_DB=str(paths.audit),
        BROKERD_BROKER__CATALOGUE_DIR=str(paths.root / "catalogue"),
    )


def mount_state(path: Path) -> None:
    """A small tmpfs for loopd's state, in this process's private mount namespace (``cli``
    entered it), so the disk-full fault fills it and nothing else, and it goes with the run."""
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={STATE_FS_MIB}m,mode=0700", "soak-state", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise SoakError(f"cannot mount the state file system: {result.stderr.strip()}")


@dataclass
class Router:
    """The run's llama-server router, which a fault kills and starts again, as a rebuild or a
    crash restarts production's: every model child and every cache goes with it, the save
    folder stays. ``known`` holds the run's own processes (``Stack.known_pids``)."""

    paths: Paths
    server: devserver.RunningServer
    known: set[int] = field(default_factory=set)
    restarts: int = 0

    def __post_init__(self) -> None:
        self.known.add(self.server.process.pid)

    @property
    def pid(self) -> int:
        return self.server.process.pid

    def kill(self) -> int:
        """SIGKILL the router and its model children at once (its process group: it leads
        one), as a crashed server goes; the router's pid. Its children die with it and come to
        this process, their subreaper, which waits for them here (they are the run's own, not
        orphans)."""
        pid = self.pid
        children = descendants_of(pid)
        self.known.update(children)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        self.server.process.wait()
        for child in children:
            _wait_for_child(child)
        return pid

    def start(self) -> int:
        """The router started again on the same socket, preset and save folder; its pid."""
        log = self.server.log_path
        kept = log.with_name(f"{log.stem}-{self.restarts}{log.suffix}")
        log.rename(kept)  # the new router writes its own log from the start
        self.server = start_router(self.paths)
        self.restarts += 1
        self.known.add(self.pid)
        return self.pid

    def stop(self) -> None:
        self.server.stop()


def _wait_for_child(pid: int, timeout_s: float = 15.0) -> None:
    """Reap ``pid``, a killed process that becomes this process's child once its parent is
    gone (a moment after the parent's own end)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:  # not handed to this process yet
            time.sleep(0.05)
        else:
            return


def start_router(paths: Paths) -> devserver.RunningServer:
    try:
        return devserver.start(
            paths.root / "llama",
            devserver.default_cache_dir(),
            socket_path=paths.router_socket,
            layout=devserver.ServerLayout(parallel=2),
            # On the router's command line, so the model child the chaos kills and the router
            # starts again saves into and restores from the same folder.
            extra_args=("--slot-save-path", f"{paths.saves}/"),
            load=(devserver.PLAIN_MODEL,),
            ready_timeout=300.0,
        )
    except devserver.DevServerError as exc:
        raise SoakError(f"the real llama-server is required and could not start: {exc}") from exc


async def wait_for(
    condition: Callable[[], Awaitable[bool]],
    what: str,
    timeout_s: float,
    service: Supervised | None = None,
) -> None:
    """Poll ``condition`` (the processes offer no event for it); ``SoakError``, with the
    service's last log lines, when it does not hold within ``timeout_s``."""
    with anyio.move_on_after(timeout_s) as scope:
        while not await condition():  # noqa: ASYNC110 - polled: no event exists for it
            await anyio.sleep(0.3)
    if scope.cancelled_caught:
        tail = ""
        if service is not None:
            tail = "\n" + "\n".join(service.log_path.read_text(errors="replace").splitlines()[-15:])
        raise SoakError(f"timed out after {timeout_s:.0f} s waiting for {what}{tail}")


@dataclass
class Stack:
    """The running system: what the users, the chaos and the checks reach it by."""

    paths: Paths
    router: Router
    world: World
    bot_id: str
    control: FakeControl
    relay: Relay
    brokerd: Supervised
    loopd: Supervised
    known_pids: set[int]  # every process the run started itself (the rest are orphans)

    def services(self) -> tuple[Supervised, Supervised]:
        return (self.loopd, self.brokerd)


async def _start_fake(
    paths: Paths, tg: TaskGroup, users: tuple[str, ...]
) -> tuple[Process, dict[str, Any]]:
    """``python -m soak.fakemm``, and the ids it announces once it listens."""
    sock = paths.root / "mm.sock"
    with paths.log("fakemm").open("ab") as err:
        process = await anyio.open_process(
            [sys.executable, "-m", "soak.fakemm", "--uds", str(sock), "--users", ",".join(users)],
            stdin=subprocess.DEVNULL,
            stderr=err,
            env=base_env(),
            cwd=REPO_ROOT,
            start_new_session=True,
        )
    assert process.stdout is not None
    buffer = b""
    with anyio.move_on_after(60):
        async for chunk in process.stdout:
            buffer += chunk
            if b"\n" in buffer:
                break
    if b"\n" not in buffer:
        raise SoakError(f"the fake Mattermost did not start; see {paths.log('fakemm')}")

    async def drain(stdout: Any) -> None:
        async for _ in stdout:
            pass

    tg.start_soon(drain, process.stdout)
    return process, json.loads(buffer.partition(b"\n")[0])


async def _terminate(process: Process) -> None:
    with anyio.CancelScope(shield=True):  # also when the run is being cancelled
        await end_process(process, timeout_s=10)


def _sockets_up(run: Path) -> Callable[[], Awaitable[bool]]:
    async def up() -> bool:
        return all((run / name).exists() for name in ("infer.sock", "chat.sock", "broker.sock"))

    return up


@asynccontextmanager
async def stack_up(
    paths: Paths,
    router: Router,
    users: tuple[str, ...],
    stream_faults: StreamFaults,
    tg: TaskGroup,
    *,
    durable: bool,
    save_cap_bytes: int,
) -> AsyncIterator[Stack]:
    """Everything but the router up and answering (loopd connected to Mattermost); the fake
    and the relay stopped on exit (loopd and brokerd are the caller's to stop first)."""
    (paths.root / "catalogue" / f"{MARK_TOOL}.toml").write_text(mark_tool_toml(str(paths.marks)))
    async with AsyncExitStack() as stack:
        fake, announced = await _start_fake(paths, tg, users)
        stack.push_async_callback(_terminate, fake)
        mm_sock = Path(announced["uds"])
        token_file = paths.root / "bot-token"
        token_file.write_text(str(announced["bot_token"]) + "\n")
        token_file.chmod(0o600)
        relay = Relay(paths.router_socket, stream_faults)
        relay_sock = paths.root / "relay.sock"
        await stack.enter_async_context(serve_relay(tg, relay, relay_sock))
        control = FakeControl(mm_sock)
        stack.push_async_callback(control.aclose)
        known = router.known
        known.add(fake.pid)
        brokerd = Supervised(
            "brokerd",
            [sys.executable, "-m", "brokerd", "serve"],
            brokerd_env(paths, relay_sock, mm_sock, token_file, save_cap_bytes),
            paths.log("brokerd"),
            on_start=known.add,
        )
        loopd = Supervised(
            "loopd serve",
            [sys.executable, "-m", "loopd", "serve"],
            loopd_env(paths, durable),
            paths.log("loopd"),
            on_start=known.add,
        )
        tg.start_soon(brokerd.run)
        await wait_for(_sockets_up(paths.run), "brokerd's three sockets", 60.0, brokerd)
        print("soak: brokerd up; starting loopd serve (self-test first)", flush=True)
        tg.start_soon(loopd.run)
        bot_id = str(announced["bot"]["id"])
        await wait_for(
            lambda: bot_connected(control, bot_id), "loopd serve to connect", READY_S, loopd
        )
        world = World.from_announcement(announced)
        yield Stack(paths, router, world, bot_id, control, relay, brokerd, loopd, known)
