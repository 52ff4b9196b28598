"""One soak run: bring the stack up (``soak.stack``), drive it with the simulated users while the
chaos breaks it, let it settle, stop it, and check what it left from the outside."""

from __future__ import annotations

import io
import json
import logging
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from signal import Signals

import anyio

from bench.machine import describe, load_average
from loopcommon.slotfiles import is_slot_file_name
from loopcommon.stopsignals import StopSignals
from soak import checks, durability
from soak.chaos import Chaos
from soak.checks import Row, Session
from soak.mattermost import FakeControl, Mirror
from soak.plan import SERVER_KILLS, Plan
from soak.procs import (
    Supervised,
    become_subreaper,
    command_of,
    descendants_of,
    fd_count,
    reap_orphans,
    rss_kib,
    state_of,
)
from soak.relay import StreamFaults
from soak.report import Cpu, Figures, Memory
from soak.script import MARK_TOOL
from soak.stack import (
    SILENCE_S,
    Paths,
    Router,
    SoakError,
    Stack,
    base_env,
    mount_state,
    stack_up,
    start_router,
)
from soak.users import Ledger, Pace, SimulatedThread

log = logging.getLogger("soak")

FD_SLACK = 16  # open files an idle loopd may hold beyond its idle start (pooled connections)
QUIET_S = 10.0  # the run has settled when nothing was posted or edited this long
LEAK_GRACE_S = 15.0  # a tool's sleep (at most 9 s) may outlive brokerd's kill by this much


@dataclass(frozen=True)
class Options:
    seconds: float
    threads: int
    seed: int
    workdir: Path
    pace: Pace
    min_tool_calls: int
    command: str
    settle_s: float  # the longest wait, after the load, for every turn to end
    durable: bool  # loopd's durable sessions (LOOPD_DURABLE on, else off)
    save_cap_bytes: int  # brokerd's cap over the server's save folder


@dataclass
class Sampler:
    """loopd's and brokerd's memory and open files, and the server's save folder, once a
    second."""

    services: tuple[Supervised, ...]
    saves: Path
    rss: list[tuple[float, int]] = field(default_factory=list)
    folder: list[tuple[float, int]] = field(default_factory=list)

    async def run(self) -> None:
        while True:
            loopd = self.services[0]
            if loopd.pid is not None and (rss := rss_kib(loopd.pid)) is not None:
                self.rss.append((time.time(), rss))
            self.folder.append((time.time(), saved_bytes(self.saves)[0]))
            await anyio.sleep(1.0)

    def open_files(self) -> dict[str, int | None]:
        return {s.name: fd_count(s.pid) if s.pid else None for s in self.services}


class SoakInterrupted(Exception):
    """A stop signal ended the run; the stack it started has been ended with it."""

    def __init__(self, signal: Signals) -> None:
        super().__init__(f"stopped by {signal.name}")
        self.signal = signal


async def _stop_on_signal(signals: StopSignals) -> None:
    raise SoakInterrupted(await signals.wait())


async def run_soak(options: Options, plan: Plan, signals: StopSignals) -> Figures:
    """One run; a stop signal (taken by ``signals`` from before the loop started) ends it as
    ``SoakInterrupted`` once everything it started has been ended."""
    started = time.time()
    paths = Paths(options.workdir)
    mount_state(paths.state)
    become_subreaper()
    figures = Figures(
        durable=options.durable,
        command=options.command,
        seed=options.seed,
        seconds=options.seconds,
        threads=options.threads,
        machine=describe(),
        load_before=load_average(),
        load_after="",
        min_tool_calls=options.min_tool_calls,
    )
    print(
        f"soak: seed {options.seed}, durable sessions {'on' if options.durable else 'off'}; "
        "starting llama-server (router, 2 slots)",
        flush=True,
    )
    router = Router(paths, await anyio.to_thread.run_sync(start_router, paths))
    stream_faults = StreamFaults(silent_s=SILENCE_S + 15.0, slow_gap_s=0.4)
    known: set[int] = set()
    try:
        async with _unwrapped(), anyio.create_task_group() as tg:
            tg.start_soon(_stop_on_signal, signals)
            async with stack_up(
                paths,
                router,
                plan.users,
                stream_faults,
                tg,
                durable=options.durable,
                save_cap_bytes=options.save_cap_bytes,
            ) as stack:
                known = stack.known_pids
                ledger, mirror = await _drive(stack, options, plan, figures, stream_faults)
            tg.cancel_scope.cancel()
    finally:
        router.stop()
    figures.leaked = await _leaks(known)
    figures.load_after = load_average()
    figures.cpu = _cpu(time.time() - started)
    _store_run(paths, ledger, mirror)
    _check(figures, paths, ledger, mirror)
    _durable_figures(figures, paths, options.save_cap_bytes)
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


async def _drive(
    stack: Stack, options: Options, plan: Plan, figures: Figures, stream_faults: StreamFaults
) -> tuple[Ledger, Mirror]:
    """The load with its faults, then the wait for every turn to end, then loopd and brokerd
    stopped; what the users did and what the fake logged."""
    await anyio.sleep(2.0)  # idle, connected: the open-files baseline
    sampler = Sampler(stack.services(), stack.paths.saves)
    baseline = sampler.open_files()
    mirror = Mirror(stack.bot_id)
    ledger = Ledger()
    orphans: list[str] = []
    chaos = Chaos(
        stack.control,
        stack.loopd,
        stack.brokerd,
        stack.router,
        stream_faults,
        stack.paths.state,
    )
    async with anyio.create_task_group() as monitors:
        monitors.start_soon(_follow, stack.control, mirror)
        monitors.start_soon(sampler.run)
        monitors.start_soon(_reap, stack.known_pids, orphans)
        load_start = time.time()
        figures.load_start = load_start
        print(
            f"soak: load for {options.seconds:.0f} s: {len(plan.threads)} threads, "
            f"{len(plan.faults)} faults planned",
            flush=True,
        )
        rng = random.Random(options.seed + 1)
        async with anyio.create_task_group() as load:
            for thread_plan in plan.threads:
                thread = SimulatedThread(
                    thread_plan,
                    stack.world,
                    stack.control,
                    mirror,
                    ledger,
                    options.pace,
                    random.Random(rng.random()),
                )
                load.start_soon(thread.run, load_start, load_start + options.seconds)
            load.start_soon(chaos.run, plan.faults, load_start)
        print(f"soak: load over ({len(ledger.posts)} posts); waiting for the turns to end")
        load_end = time.time()
        figures.drained = await _settle(mirror, ledger, options.settle_s)
        figures.settle_s = (time.time() - load_end, options.settle_s)
        end = sampler.open_files()
        for service in stack.services():
            await service.stop()
        monitors.cancel_scope.cancel()
    await stack.control.pull(mirror)
    rss = [r for _, r in sampler.rss]
    figures.folder_samples = sampler.folder
    figures.memory = Memory(
        rss[0] if rss else None, rss[-1] if rss else None, max(rss, default=None)
    )
    figures.fds = {name: (baseline[name], end[name]) for name in baseline}
    figures.fd_leaks = [
        f"{name}: {a} idle at start, {b} at the end"
        for name, (a, b) in figures.fds.items()
        if a is not None and b is not None and b > a + FD_SLACK
    ]
    figures.exits = [e for s in stack.services() for e in s.exits]
    figures.start_limit_hits = [
        f"{s.name} at {t - load_start:.0f} s"
        for s in stack.services()
        for t in s.start_limit_hits()
    ]
    figures.orphans = orphans
    figures.faults = chaos.injected
    figures.scripted_rounds = stack.relay.counters.scripted_rounds
    figures.disk_full_seen = chaos.disk_full_lines()
    return ledger, mirror


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
    happened for ``QUIET_S``; False if that does not come within ``timeout_s``."""
    with anyio.move_on_after(timeout_s):
        while True:
            await anyio.sleep(1.0)
            last_by_root: dict[str, float] = {}
            for post in ledger.posts:
                last_by_root[post.root_id] = max(last_by_root.get(post.root_id, 0.0), post.at)
            answered = all(mirror.replied_since(root, at) for root, at in last_by_root.items())
            running = any(mirror.status_post(root) for root in last_by_root)
            idle = not mirror.entries or time.time() - mirror.entries[-1].at > QUIET_S
            if answered and not running and idle:
                return True
    return False


async def _leaks(known: set[int]) -> list[str]:
    """Processes the run caused that are still alive once everything was stopped."""
    left: list[int] = []
    with anyio.move_on_after(LEAK_GRACE_S):
        while left := [p for p in descendants_of(os.getpid()) if state_of(p) not in (None, "Z")]:
            reap_orphans(known)
            await anyio.sleep(0.5)
    reap_orphans(known)
    return [f"pid {p}: {command_of(p)}" for p in left]


def _cpu(wall_s: float) -> Cpu:
    """CPU time of this process (the users, the chaos, the relay) and of every process it
    waited for (the stack), against what the machine's cores could give in ``wall_s``."""
    times = os.times()
    cores = len(os.sched_getaffinity(0))
    return Cpu(
        own_s=times.user + times.system,
        children_s=times.children_user + times.children_system,
        capacity_s=wall_s * cores,
    )


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


# -- the outside reads ---------------------------------------------------------------------------


def read_sessions(db_path: Path) -> list[Session]:
    """Every Mattermost session of the log, read with ``loopd sessions`` and ``loopd log
    export`` (their functions, called here to spare a process per session)."""
    from loopd.cli.log import export_log
    from loopd.logviews import list_sessions

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
    """``mark_ticket`` calls brokerd's audit log shows started."""
    if not audit.exists():
        return 0
    db = sqlite3.connect(f"file:{audit}?mode=ro", uri=True)
    try:
        query = "SELECT count(*) FROM call_started WHERE tool = ?"
        row = db.execute(query, (MARK_TOOL,)).fetchone()
    finally:
        db.close()
    return int(row[0])


def read_held(state_dir: Path, sessions: list[Session]) -> frozenset[str]:
    """Post ids ``chat.db`` still held (came while their thread's turn ran) when loopd stopped."""
    from loopd.chat.cursor import ChatState

    state = ChatState.open(state_dir / "chat.db")
    try:
        return frozenset(post_id for s in sessions for post_id, _ in state.held(s.name))
    finally:
        state.close()


def _keep_state(paths: Paths) -> None:
    """A copy of loopd's state beside the logs: the small file system goes with the run's mount
    namespace, and a failed run is read from what it left."""
    copy = paths.root / "state-copy"
    copy.mkdir(exist_ok=True)
    for path in paths.state.iterdir():
        if path.is_file() and path.name.endswith((".db", ".db-wal", ".db-shm")):
            shutil.copy2(path, copy / path.name)


def _check(figures: Figures, paths: Paths, ledger: Ledger, mirror: Mirror) -> None:
    _keep_state(paths)
    sessions = read_sessions(paths.state / "loopd.db")
    verdict = checks.check_messages(
        ledger,
        mirror.entries,
        mirror.bot_id,
        sessions,
        settled=figures.drained,
        held=read_held(paths.state, sessions),
    )
    figures.pending = verdict.pending
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
    notices = sum(1 for c in verdict.coverage if c.how == "notice")
    figures.notices = notices + verdict.edits_acknowledged
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
    figures.slots = checks.slot_waits(
        mirror.entries, mirror.bot_id, {s.name: s.slot for s in sessions}
    )
    fault_times = [f.at for f in figures.faults if f.fired]
    figures.latencies = checks.latencies(verdict.coverage, fault_times)


# -- durable sessions ----------------------------------------------------------------------------


def saved_bytes(folder: Path) -> tuple[int, int]:
    """Bytes and number of loopd's saved states in the server's save folder."""
    total = count = 0
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return 0, 0
    for entry in entries:
        if is_slot_file_name(entry.name):
            try:
                total += entry.stat(follow_symlinks=False).st_size
            except OSError:  # removed meanwhile (brokerd keeps the cap)
                continue
            count += 1
    return total, count


def read_requests(db_path: Path) -> list[durability.Request]:
    """Every request loopd recorded, as ``loopd perf --json`` gives it."""
    from loopd.observe.perfsummary import perf_records
    from loopd.sessionlog.reading import existing_log

    with existing_log(db_path) as log:
        if log is None:
            return []
        return [
            durability.Request.from_record(record)
            for session in log.sessions()
            for record in perf_records(session.name, log.requests(session.name))
        ]


DURABLE_SAID = "durable sessions: "


def durable_line(loopd_log: Path) -> str:
    """loopd's own word on durable sessions, at its last start (its log is JSON lines): from
    ``durable sessions: `` to the end of the line that says what is known of its server."""
    try:
        text = loopd_log.read_text(errors="replace")
    except OSError:
        return ""
    said = ""
    for line in text.splitlines():
        if DURABLE_SAID not in line:
            continue
        try:
            msg = str(json.loads(line).get("msg", ""))
        except ValueError:  # a line cut by a kill
            continue
        if DURABLE_SAID in msg:
            said = msg[msg.index(DURABLE_SAID) :]
    return said


def _durable_figures(figures: Figures, paths: Paths, cap_bytes: int) -> None:
    from loopd.observe.perfsummary import RETURN_CAUSES

    requests = read_requests(paths.state / "loopd.db")
    kills = [
        f.struck
        for f in figures.faults
        if f.kind in SERVER_KILLS and f.fired and f.struck is not None
    ]
    figures.returns = durability.returns_after_kills(requests, kills)
    figures.reuse = durability.reuse(requests, (c.value for c in RETURN_CAUSES))
    end_bytes, end_files = saved_bytes(paths.saves)
    try:
        brokerd_log = paths.log("brokerd").read_text(errors="replace")
    except OSError:
        brokerd_log = ""
    figures.folder = durability.Folder(
        cap_bytes,
        tuple(figures.folder_samples),
        end_bytes,
        end_files,
        durability.evicted_files(brokerd_log),
    )
    figures.durable_said = durable_line(paths.log("loopd"))
