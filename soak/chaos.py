"""Faults at the planned times, each confirmed to have hit something (a fault armed into an idle
system proves nothing): a kill needs a live process, a switch on the fake needs to have been
used, a stream fault needs a stream."""

from __future__ import annotations

import logging
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import anyio

from soak.mattermost import FakeControl
from soak.plan import FaultKind, FaultPlan
from soak.procs import Supervised, children_of, command_of
from soak.relay import StreamFaults
from soak.stack import Router

log = logging.getLogger("soak.chaos")

ALIVE_WAIT_S = 30.0  # a kill waits this long for its target to be up again
CONFIRM_WAIT_S = 30.0  # an armed fault has this long to be used
# A fault that needs a turn in flight (a stream to slow or silence, a status post to edit) waits
# longer: on a loaded machine turns are few and far between, and the backlog of the load keeps
# them coming after it. Armed into a system with nothing left to do it still fails the run.
TURN_WAIT_S = 300.0
# The disk stays full at least this long, and until loopd reports it (a write of its own failed),
# at most DISK_FULL_MAX_S: in a quiet moment loopd may write nothing at all.
DISK_FULL_S = 4.0
DISK_FULL_MAX_S = 15.0
# Edits are refused at least this long, and until one was refused (a turn's status post is edited
# every few seconds while it runs), at most TURN_WAIT_S.
EDIT_REFUSED_S = 4.0
BURST_429 = 6
BURST_5XX = 3


@dataclass
class Injected:
    kind: FaultKind
    at: float  # wall time it was injected
    fired: bool = False
    detail: str = ""
    until: float | None = None  # when its effect was taken away again (a window fault)
    struck: float | None = None  # when a kill hit its target (it may wait for one to be up)


@dataclass
class Chaos:
    control: FakeControl
    loopd: Supervised
    brokerd: Supervised
    router: Router
    stream_faults: StreamFaults
    state_dir: Path
    injected: list[Injected] = field(default_factory=list)

    async def run(self, faults: tuple[FaultPlan, ...], load_start: float) -> None:
        async with anyio.create_task_group() as tg:
            for planned in faults:
                await anyio.sleep(max(0.0, load_start + planned.at_s - time.time()))
                injected = Injected(planned.kind, time.time())
                self.injected.append(injected)
                tg.start_soon(self._inject, injected)

    async def _inject(self, fault: Injected) -> None:
        try:
            await self._dispatch(fault)
        except Exception as exc:  # a fault that could not be injected is reported, not fatal
            fault.detail = f"could not inject: {type(exc).__name__}: {exc}"
            log.warning("%s: %s", fault.kind, fault.detail)
        log.info("fault %s: fired=%s %s", fault.kind, fault.fired, fault.detail)

    async def _dispatch(self, fault: Injected) -> None:
        match fault.kind:
            case FaultKind.LOOPD_KILL:
                await self._kill(fault, self.loopd)
            case FaultKind.BROKERD_KILL:
                await self._kill(fault, self.brokerd)
            case FaultKind.LLAMA_CHILD_KILL:
                await self._kill_llama_child(fault)
            case FaultKind.LLAMA_RESTART:
                await self._restart_router(fault)
            case FaultKind.WS_DROP:
                with anyio.move_on_after(CONFIRM_WAIT_S):
                    while not fault.fired:
                        dropped = await self.control.fault("drop_sockets")
                        fault.fired = bool(dropped)
                        fault.detail = f"{dropped} socket(s) dropped"
                        if not fault.fired:
                            await anyio.sleep(1.0)
            case FaultKind.BURST_429:
                await self.control.fault("burst_429", count=BURST_429, retry_after_s=1)
                await self._until_used(fault, "forced_429_left", BURST_429, "429s")
            case FaultKind.BURST_5XX:
                await self.control.fault("fail_next_creates", count=BURST_5XX, status=503)
                await self._until_used(fault, "failing_creates_left", BURST_5XX, "503s")
            case FaultKind.EDIT_REFUSED:
                await self._refuse_edits(fault)
            case FaultKind.STREAM_SILENT:
                await self._stream(fault, "silent")
            case FaultKind.STREAM_SLOW:
                await self._stream(fault, "slow")
            case FaultKind.DISK_FULL:
                await self._fill_disk(fault)

    async def _kill(self, fault: Injected, target: Supervised) -> None:
        with anyio.move_on_after(ALIVE_WAIT_S):
            while target.pid is None or time.time() - target.started_at < 1.0:  # noqa: ASYNC110
                await anyio.sleep(0.2)
        pid = target.kill()
        fault.struck = time.time()
        fault.fired = pid is not None
        fault.detail = f"pid {pid}, up {time.time() - target.started_at:.0f} s"

    async def _kill_llama_child(self, fault: Injected) -> None:
        child = None
        with anyio.move_on_after(ALIVE_WAIT_S):
            while child is None:
                kids = children_of(self.router.pid)
                child = next((k for k in kids if "--alias" in command_of(k)), None)
                if child is None:
                    await anyio.sleep(0.5)
        if child is not None:
            os.kill(child, signal.SIGKILL)
            fault.struck = time.time()
            fault.fired = True
            fault.detail = f"pid {child} (the router reloads the model on the next request)"

    async def _restart_router(self, fault: Injected) -> None:
        """Kill the whole server (router and model child) and start it again: requests fail
        meanwhile, as they do while production's server restarts."""
        old = await anyio.to_thread.run_sync(self.router.kill)
        fault.struck = time.time()
        fault.fired = True
        new = await anyio.to_thread.run_sync(self.router.start)
        fault.until = time.time()
        fault.detail = (
            f"pid {old} killed, pid {new} serving again {fault.until - fault.struck:.0f} s later"
        )

    async def _until_used(self, fault: Injected, field_name: str, armed: int, what: str) -> None:
        left = armed
        with anyio.move_on_after(CONFIRM_WAIT_S):
            while left == armed:
                await anyio.sleep(0.5)
                left = int((await self.control.faults_left())[field_name])
        fault.fired = left < armed
        fault.detail = f"{armed - left} of {armed} {what} answered"

    async def _refuse_edits(self, fault: Injected) -> None:
        before = int((await self.control.faults_left())["refused_patch_requests"])
        await self.control.fault("refuse_patches", status=403)
        refused = 0
        try:
            await anyio.sleep(EDIT_REFUSED_S)
            with anyio.move_on_after(TURN_WAIT_S):
                while refused == 0:
                    refused = int((await self.control.faults_left())["refused_patch_requests"])
                    refused -= before
                    if refused == 0:
                        await anyio.sleep(0.5)
        finally:
            with anyio.CancelScope(shield=True):
                await self.control.fault("refuse_patches", status=None)
            fault.until = until = time.time()
        refused = int((await self.control.faults_left())["refused_patch_requests"]) - before
        fault.fired = refused > 0
        fault.detail = f"{refused} edit(s) refused (403) in {until - fault.at:.0f} s"

    async def _stream(self, fault: Injected, how: str) -> None:
        hits = self.stream_faults.silent_hit if how == "silent" else self.stream_faults.slow_hit
        before = len(hits)
        if how == "silent":
            self.stream_faults.silent_armed += 1
        else:
            self.stream_faults.slow_armed += 1
        with anyio.move_on_after(TURN_WAIT_S):
            while len(hits) == before:  # noqa: ASYNC110
                await anyio.sleep(0.5)
        fault.fired = len(hits) > before
        fault.detail = "a turn's stream" + (
            f" went silent for {self.stream_faults.silent_s:.0f} s"
            if how == "silent"
            else f" slowed to one chunk per {self.stream_faults.slow_gap_s} s"
        )

    async def _fill_disk(self, fault: Injected) -> None:
        """Fill the state directory's small file system to the last block, hold, free it."""
        filler = self.state_dir / "soak-filler"
        written = 0
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            for size in (1 << 20, 1 << 16, 1 << 12, 1 << 9):
                chunk = b"\0" * size
                while True:
                    try:
                        count = os.write(fd, chunk)
                    except OSError:  # ENOSPC: on to a smaller chunk for the rest
                        break
                    written += count
                    if count < size:
                        break
            fault.fired = os.statvfs(self.state_dir).f_bavail == 0
            seen = self.disk_full_lines()
            await anyio.sleep(DISK_FULL_S)
            with anyio.move_on_after(DISK_FULL_MAX_S - DISK_FULL_S):
                while self.disk_full_lines() == seen:  # noqa: ASYNC110 - a log file to watch
                    await anyio.sleep(0.5)
            hit = self.disk_full_lines() > seen
        finally:
            os.close(fd)
            filler.unlink(missing_ok=True)
            fault.until = time.time()
        held = fault.until - fault.at
        fault.detail = f"{written >> 20} MiB written until ENOSPC, held {held:.0f} s; " + (
            "loopd reported the full disk" if hit else "loopd wrote nothing meanwhile"
        )

    def disk_full_lines(self) -> int:
        """Lines of loopd's log that report a full disk: the session log's "disk full
        (SQLITE_FULL)", SQLite's own "database or disk is full" for the chat state."""
        try:
            text = self.loopd.log_path.read_text(errors="replace")
        except OSError:
            return 0
        marks = ("disk full", "disk is full", "SQLITE_FULL")
        return sum(any(mark in line for mark in marks) for line in text.splitlines())
