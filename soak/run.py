"""One soak run: bring the stack up, drive it, break it, let it settle, stop it, check it.

Everything runs as separate processes except the inference relay (``soak.relay``), which lives in
this one: llama-server (router mode), the fake Mattermost (``soak.fakemm``), brokerd (all three
sockets) and ``loopd serve``, the last two under ``procs.Supervised``.
"""

from __future__ import annotations

import io
import json
import logging
import os
import random
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import TaskGroup

from bench.machine import describe, load_average
from loopd_dev import devserver
from soak import checks
from soak.chaos import Chaos
from soak.checks import Row, Session
from soak.mattermost import FakeControl, Mirror, bot_connected
from soak.plan import Plan
from soak.procs import (
    Supervised,
    become_subreaper,
    command_of,
    descendants_of,
    fd_count,
    reap_orphans,
    rss_kib,
)
from soak.relay import Relay, StreamFaults, serve_relay
from soak.report import Figures, Memory
from soak.script import MARK_TOOL, mark_tool_toml
from soak.users import Ledger, Pace, SimulatedThread, World

log = logging.getLogger("soak")

REPO_ROOT = Path(__file__).resolve().parents[1]
STATE_FS_MIB = 64
READY_S = 180.0  # loopd's start on a loaded machine: imports, the self-test, the first connect
# LOOPD_SILENCE_S: a stream silent this long is closed. Not lower: llama-server sends no progress
# while it reads a prompt batch, which on a loaded two-core machine can take many seconds.
SILENCE_S = 30.0
FD_SLACK = 16  # open files an idle loopd may hold beyond its idle start (pooled connections)


class SoakError(RuntimeError):
    """The stack could not be brought up; the message says which part and why."""


@dataclass(frozen=True)
class Options:
    seconds: float
    threads: int
    seed: int
    workdir: Path
    pace: Pace
    min_tool_calls: int
    command: str


@dataclass
class Paths:
    root: Path

    def __post_init__(self) -> None:
        for sub in ("llama", "run", "state", "logs", "catalogue", "marks"):
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

    def log(self, name: str) -> Path:
        return self.root / "logs" / f"{name}.log"


def base_env(**extra: str) -> dict[str, str]:
    """This process's environment without any LOOPD_* or BROKERD_* knob of the caller's (the
    build cache excepted), the repository importable, and ``extra``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("LOOPD_", "BROKERD_")) or k == "LOOPD_CACHE_DIR"
    }
    env["PYTHONPATH"] = str(REPO_ROOT)
    env.update(extra)
    return env


def loopd_env(paths: Paths) -> dict[str, str]:
    return base_env(
        LOOPD_INFER_URL=f"unix:{paths.run}/infer.sock",
        LOOPD_MODEL=devserver.PLAIN_MODEL,
        LOOPD_STATE_DIR=str(paths.state),
        LOOPD_BROKER_URL=f"unix:{paths.run}/broker.sock",
        LOOPD_SLOTS="0,1",
        LOOPD_FIRST_BYTE_S="120",
        LOOPD_SILENCE_S=str(SILENCE_S),
        # Short answers: the tiny model's text does not matter here, its turns do; on a loaded
        # two-core machine each generated token costs a slot tens of milliseconds.
        LOOPD_MAX_TOKENS="24",
        LOOPD_THINK_CAP="0",  # the plain model does not think; a cap needs room above it
        # The plain template renders no tools, so a prompt is small: the long threads compact
        # after a few of their long messages only below a fifth of the slot's 4096 tokens.
        LOOPD_COMPACT_AT="0.2",
        LOOPD_SUMMARY_MAX_TOKENS="96",
        LOOPD_LOG_FORMAT="json",
        LOOPD_MM_URL=f"unix:{paths.run}/chat.sock",
        LOOPD_MM_ALLOWED_USERS="*",
        LOOPD_MM_ALLOWED_TEAMS="*",
        LOOPD_MM_STATUS_INTERVAL_S="1",
        LOOPD_MM_PING_INTERVAL_S="10",
        LOOPD_MM_BACKOFF_S="1",
        LOOPD_MM_RETRY_FOR_S="60",
    )


def brokerd_env(paths: Paths, relay_sock: Path, mm_sock: Path, token_file: Path) -> dict[str, str]:
    return base_env(
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


@dataclass
class Sampler:
    """loopd's and brokerd's memory and open files, once a second."""

    loopd: Supervised
    brokerd: Supervised
    rss: list[tuple[float, int]] = field(default_factory=list)
    fds: dict[str, list[tuple[float, int]]] = field(default_factory=dict)

    async def run(self) -> None:
        while True:
            now = time.time()
            for service in (self.loopd, self.brokerd):
                pid = service.pid
                if pid is None:
                    continue
                count = fd_count(pid)
                if count is not None:
                    self.fds.setdefault(service.name, []).append((now, count))
                if service is self.loopd and (rss := rss_kib(pid)) is not None:
                    self.rss.append((now, rss))
            await anyio.sleep(1.0)


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


def start_router(paths: Paths) -> devserver.RunningServer:
    try:
        return devserver.start(
            paths.root / "llama",
            devserver.default_cache_dir(),
            socket_path=paths.root / "llama" / "llama.sock",
            layout=devserver.ServerLayout(parallel=2),
            load=(devserver.PLAIN_MODEL,),
            ready_timeout=300.0,
        )
    except devserver.DevServerError as exc:
        raise SoakError(f"the real llama-server is required and could not start: {exc}") from exc


async def start_fake(
    paths: Paths, tg: TaskGroup, users: tuple[str, ...]
) -> tuple[Any, dict[str, Any]]:
    sock = paths.root / "mm.sock"
    out = paths.log("fakemm")
    process = await anyio.open_process(
        [sys.executable, "-m", "soak.fakemm", "--uds", str(sock), "--users", ",".join(users)],
        stdin=subprocess.DEVNULL,
        stderr=out.open("ab"),
        env=base_env(),
        cwd=REPO_ROOT,
        start_new_session=True,
    )
    assert process.stdout is not None
    buffer = b""
    with anyio.fail_after(60):
        while b"\n" not in buffer:
            buffer += await process.stdout.receive()
    announcement = json.loads(buffer.partition(b"\n")[0])

    async def drain_stdout() -> None:
        assert process.stdout is not None
        async for _ in process.stdout:
            pass

    tg.start_soon(drain_stdout)
    return process, announcement


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


async def run_soak(options: Options, plan: Plan) -> Figures:
    paths = Paths(options.workdir)
    mount_state(paths.state)
    become_subreaper()
    (paths.root / "catalogue" / f"{MARK_TOOL}.toml").write_text(mark_tool_toml(str(paths.marks)))
    figures = Figures(
        command=options.command,
        seed=options.seed,
        seconds=options.seconds,
        threads=options.threads,
        machine=describe(),
        load_before=load_average(),
        load_after="",
        min_tool_calls=options.min_tool_calls,
    )
    print(f"soak: seed {options.seed}; starting llama-server (router, 2 slots)", flush=True)
    router = await anyio.to_thread.run_sync(start_router, paths)
    known_pids = {router.process.pid}
    try:
        async with _unwrapped(), anyio.create_task_group() as tg, AsyncExitStack() as stack:
            ledger, mirror = await _run(
                options, plan, paths, router, known_pids, figures, tg, stack
            )
            tg.cancel_scope.cancel()
    finally:
        router.stop()
    figures.leaked = await _leaks(known_pids)
    figures.load_after = load_average()
    _store_run(paths, ledger, mirror)
    _check(figures, paths, ledger, mirror)
    return figures


@asynccontextmanager
async def _unwrapped() -> AsyncIterator[None]:
    """A task group's one error as itself (a ``SoakError`` must reach the command line)."""
    try:
        yield
    except BaseExceptionGroup as group:
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise


async def _run(
    options: Options,
    plan: Plan,
    paths: Paths,
    router: devserver.RunningServer,
    known: set[int],
    figures: Figures,
    tg: TaskGroup,
    stack: AsyncExitStack,
) -> tuple[Ledger, Mirror]:
    fake_process, announcement = await start_fake(paths, tg, plan.users)
    known.add(fake_process.pid)
    stack.push_async_callback(_terminate, fake_process)
    mm_sock = Path(announcement["uds"])
    token_file = paths.root / "bot-token"
    token_file.write_text(str(announcement["bot_token"]) + "\n")
    token_file.chmod(0o600)
    bot_id = str(announcement["bot"]["id"])

    stream_faults = StreamFaults(silent_s=SILENCE_S + 15.0, slow_gap_s=0.4)
    relay = Relay(paths.root / "llama" / "llama.sock", stream_faults)
    relay_sock = paths.root / "relay.sock"
    await stack.enter_async_context(serve_relay(tg, relay, relay_sock))

    control = FakeControl(mm_sock)
    stack.push_async_callback(control.aclose)
    brokerd = Supervised(
        "brokerd",
        [sys.executable, "-m", "brokerd", "serve"],
        brokerd_env(paths, relay_sock, mm_sock, token_file),
        paths.log("brokerd"),
        on_start=known.add,
    )
    loopd = Supervised(
        "loopd serve",
        [sys.executable, "-m", "loopd", "serve"],
        loopd_env(paths),
        paths.log("loopd"),
        on_start=known.add,
    )
    tg.start_soon(brokerd.run)
    await wait_for(_sockets_up(paths.run), "brokerd's three sockets", 60.0, brokerd)
    print("soak: brokerd up; starting loopd serve (self-test first)", flush=True)
    tg.start_soon(loopd.run)
    await wait_for(lambda: bot_connected(control, bot_id), "loopd serve to connect", READY_S, loopd)
    await anyio.sleep(2.0)
    baseline = {s.name: fd_count(s.pid) if s.pid else None for s in (loopd, brokerd)}

    mirror = Mirror(bot_id)
    sampler = Sampler(loopd, brokerd)
    orphans: list[str] = []
    tg.start_soon(_follow, control, mirror)
    tg.start_soon(sampler.run)
    tg.start_soon(_reap, known, orphans)

    ledger = Ledger()
    world = World.from_announcement(announcement)
    load_start = time.time()
    load_end = load_start + options.seconds
    figures.load_start = load_start
    rng = random.Random(options.seed + 1)
    print(
        f"soak: load for {options.seconds:.0f} s: {len(plan.threads)} threads, "
        f"{len(plan.faults)} faults planned",
        flush=True,
    )
    chaos = Chaos(control, loopd, brokerd, lambda: router.process.pid, stream_faults, paths.state)
    async with anyio.create_task_group() as load:
        for thread_plan in plan.threads:
            thread = SimulatedThread(
                thread_plan,
                world,
                control,
                mirror,
                ledger,
                options.pace,
                random.Random(rng.random()),
            )
            load.start_soon(thread.run, load_start, load_end)
        load.start_soon(chaos.run, plan.faults, load_start)
    print(f"soak: load over ({len(ledger.posts)} posts); waiting for the turns to end", flush=True)
    figures.drained = await _settle(mirror, ledger, max(240.0, options.seconds * 0.75))
    figures.memory = Memory(
        sampler.rss[0][1] if sampler.rss else None,
        sampler.rss[-1][1] if sampler.rss else None,
        max((r for _, r in sampler.rss), default=None),
    )
    end_fds = {s.name: fd_count(s.pid) if s.pid else None for s in (loopd, brokerd)}
    figures.fds = {name: (baseline[name], end_fds[name]) for name in baseline}
    figures.fd_leaks = [
        f"{name}: {a} idle at start, {b} at the end"
        for name, (a, b) in figures.fds.items()
        if a is not None and b is not None and b > a + FD_SLACK
    ]
    await loopd.stop()
    await brokerd.stop()
    await control.pull(mirror)
    figures.exits = loopd.exits + brokerd.exits
    figures.start_limit_hits = [
        f"{s.name} at {t - load_start:.0f} s"
        for s in (loopd, brokerd)
        for t in s.start_limit_hits()
    ]
    figures.orphans = orphans
    figures.faults = chaos.injected
    figures.scripted_rounds = relay.counters.scripted_rounds
    figures.disk_full_seen = chaos.disk_full_lines()
    return ledger, mirror


async def _terminate(process: Any) -> None:
    if process.returncode is None:
        process.terminate()
        with anyio.move_on_after(10):
            await process.wait()
        if process.returncode is None:
            process.kill()
            await process.wait()


def _sockets_up(run: Path) -> Callable[[], Awaitable[bool]]:
    async def up() -> bool:
        return all((run / name).exists() for name in ("infer.sock", "chat.sock", "broker.sock"))

    return up


async def _follow(control: FakeControl, mirror: Mirror) -> None:
    while True:
        try:
            await control.pull(mirror)
        except Exception as exc:  # the fake busy for a moment: read again next time
            log.info("reading the fake's log: %s", exc)
        await anyio.sleep(0.5)


async def _reap(known: set[int], orphans: list[str]) -> None:
    while True:
        orphans.extend(f"pid {pid}" for pid in reap_orphans(known))
        await anyio.sleep(2.0)


async def _settle(mirror: Mirror, ledger: Ledger, timeout_s: float) -> bool:
    """Wait until every thread's last message has its reply, no status post is up, and nothing
    happened for a while; False if that does not come within ``timeout_s``."""
    quiet_s = 10.0
    with anyio.move_on_after(timeout_s):
        while True:
            await anyio.sleep(1.0)
            last_by_root: dict[str, float] = {}
            for post in ledger.posts:
                last_by_root[post.root_id] = max(last_by_root.get(post.root_id, 0.0), post.at)
            answered = all(mirror.replied_since(root, at) for root, at in last_by_root.items())
            running = any(mirror.status_post(root) for root in last_by_root)
            idle = not mirror.entries or time.time() - mirror.entries[-1].at > quiet_s
            if answered and not running and idle:
                return True
    return False


async def _leaks(known: set[int]) -> list[str]:
    """Processes of the run still alive once everything was stopped (after a grace period for
    a tool's sleep to end)."""
    left: list[int] = []
    with anyio.move_on_after(15.0):
        while left := [p for p in descendants_of(os.getpid()) if _alive(p)]:
            reap_orphans(set())
            await anyio.sleep(0.5)
    return [f"pid {p}: {command_of(p)}" for p in left]


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def _store_run(paths: Paths, ledger: Ledger, mirror: Mirror) -> None:
    """What the checks read, saved in the work folder (kept on failure, for a look)."""
    data = {
        "posts": [p.__dict__ for p in ledger.posts],
        "edits": [e.__dict__ for e in ledger.edits],
        "reactions": [r.__dict__ for r in ledger.reactions],
        "bot_id": mirror.bot_id,
        "entries": [e.__dict__ for e in mirror.entries],
    }
    (paths.root / "observed.json").write_text(json.dumps(data))


def read_sessions(db_path: Path) -> list[Session]:
    """Every Mattermost session of the log, read with ``loopd``'s own export."""
    from loopd.sessionlog.commands import export_log, list_sessions

    out, err = io.StringIO(), io.StringIO()
    if list_sessions(db_path, out, err) != 0:
        raise SoakError(f"loopd sessions failed: {err.getvalue().strip()}")
    sessions = []
    for line in out.getvalue().splitlines()[1:]:
        parts = line.split()
        if len(parts) < 2 or not parts[0].startswith("mm:"):
            continue
        rows_out, rows_err = io.StringIO(), io.StringIO()
        if export_log(db_path, parts[0], rows_out, rows_err) != 0:
            raise SoakError(f"loopd log export {parts[0]}: {rows_err.getvalue().strip()}")
        rows = tuple(Row.from_export(json.loads(r)) for r in rows_out.getvalue().splitlines())
        sessions.append(Session(parts[0], int(parts[1]), rows))
    return sessions


def _verify(paths: Paths) -> tuple[bool, str]:
    """``loopd log verify``, the command itself, on the state the run leaves."""
    result = subprocess.run(
        [sys.executable, "-m", "loopd", "log", "verify"],
        capture_output=True,
        text=True,
        env=base_env(LOOPD_STATE_DIR=str(paths.state)),
        check=False,
    )
    said = (result.stdout.strip() or result.stderr.strip()).splitlines()
    return result.returncode == 0, (said[0] if said else f"exit {result.returncode}")[:300]


def _audit_started(audit: Path) -> int:
    if not audit.exists():
        return 0
    db = sqlite3.connect(f"file:{audit}?mode=ro", uri=True)
    try:
        row = db.execute(
            "SELECT count(*) FROM call_started WHERE tool = ?", (MARK_TOOL,)
        ).fetchone()
    finally:
        db.close()
    return int(row[0])


def _check(figures: Figures, paths: Paths, ledger: Ledger, mirror: Mirror) -> None:
    sessions = read_sessions(paths.state / "loopd.db")
    verdict = checks.check_messages(ledger, mirror.entries, mirror.bot_id, sessions)
    figures.messages = sum(1 for p in ledger.posts if p.kind == "message")
    figures.stop_posts = verdict.stop_posts
    figures.edits = len(ledger.edits)
    figures.edits_acknowledged = verdict.edits_acknowledged
    figures.reactions = len(ledger.reactions)
    figures.lost = verdict.lost
    figures.answered_twice = verdict.answered_twice
    figures.stored_twice = verdict.stored_twice
    figures.error_then_answered = verdict.error_then_answered
    figures.answers, figures.stops, figures.errors = verdict.answers, verdict.stops, verdict.errors
    figures.notices = (
        sum(1 for c in verdict.coverage if c.how == "notice") + verdict.edits_acknowledged
    )
    marks = paths.marks.read_text().split() if paths.marks.exists() else []
    figures.tool_calls = len(marks)
    figures.tools_twice = checks.tools_twice(marks)
    figures.tools_started = _audit_started(paths.audit)
    figures.compactions = sum(
        1
        for s in sessions
        for r in s.rows
        if r.kind == "user" and (r.external_key or "").startswith("loopd-summary")
    )
    figures.verify_ok, figures.verify = _verify(paths)
    slots = {s.name: s.slot for s in sessions}
    figures.slots = checks.slot_waits(mirror.entries, mirror.bot_id, slots)
    fault_times = [f.at for f in figures.faults if f.fired]
    figures.latencies = checks.latencies(verdict.coverage, fault_times)
