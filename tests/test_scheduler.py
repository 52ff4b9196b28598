"""The slot scheduler: FIFO per slot, slots concurrent, positions, cancellation."""

from __future__ import annotations

import anyio
import pytest

from loopd.scheduler import Scheduler

pytestmark = pytest.mark.anyio


async def test_one_slot_runs_fifo_and_a_returning_session_goes_behind() -> None:
    scheduler = Scheduler()
    order: list[str] = []
    release = anyio.Event()

    async def turn(session: str, hold: bool = False) -> None:
        async with scheduler.slot(session, 0):
            order.append(session)
            if hold:
                await release.wait()

    async with anyio.create_task_group() as tg:
        tg.start_soon(turn, "a", True)
        await anyio.wait_all_tasks_blocked()
        for name in ("b", "c"):
            tg.start_soon(turn, name)
            await anyio.wait_all_tasks_blocked()
        tg.start_soon(turn, "a")  # "a" comes back while it still runs: behind b and c
        await anyio.wait_all_tasks_blocked()
        assert [scheduler.position(s, 0) for s in "abc"] == [0, 1, 2]
        release.set()
    assert order == ["a", "b", "c", "a"]


async def test_different_slots_run_at_once() -> None:
    scheduler = Scheduler()
    inside = 0
    most = 0

    async def turn(session: str, slot: int) -> None:
        nonlocal inside, most
        async with scheduler.slot(session, slot):
            inside += 1
            most = max(most, inside)
            await anyio.wait_all_tasks_blocked()
            inside -= 1

    async with anyio.create_task_group() as tg:
        tg.start_soon(turn, "a", 0)
        tg.start_soon(turn, "b", 1)
    assert most == 2


async def test_positions_are_announced_and_a_cancelled_waiter_leaves() -> None:
    scheduler = Scheduler()
    seen: list[int] = []
    release = anyio.Event()

    async def holder() -> None:
        async with scheduler.slot("a", 0):
            await release.wait()

    async with anyio.create_task_group() as tg:
        tg.start_soon(holder)
        await anyio.wait_all_tasks_blocked()
        waiting = anyio.CancelScope()
        tg.start_soon(_wait_in_line, scheduler, "b", waiting)
        await anyio.wait_all_tasks_blocked()
        tg.start_soon(_record, scheduler, "c", seen)
        await anyio.wait_all_tasks_blocked()
        assert seen == [2]
        waiting.cancel()
        await anyio.wait_all_tasks_blocked()
        assert seen == [2, 1]
        assert scheduler.position("b", 0) is None
        release.set()
    assert seen == [2, 1, 0]
    assert scheduler.holder(0) is None


async def _wait_in_line(scheduler: Scheduler, session: str, scope: anyio.CancelScope) -> None:
    with scope:
        async with scheduler.slot(session, 0):
            pass


async def _record(scheduler: Scheduler, session: str, seen: list[int]) -> None:
    async with scheduler.slot(session, 0, seen.append):
        pass


async def test_a_slot_released_with_nobody_waiting_is_announced_idle() -> None:
    scheduler = Scheduler()
    idle: list[int] = []
    scheduler.on_idle(idle.append)
    release = anyio.Event()

    async def turn(session: str, slot: int, hold: bool = False) -> None:
        async with scheduler.slot(session, slot):
            if hold:
                await release.wait()

    async with anyio.create_task_group() as tg:
        tg.start_soon(turn, "a", 0, True)
        await anyio.wait_all_tasks_blocked()
        tg.start_soon(turn, "b", 0)  # waits behind a: a's release hands the slot over
        await anyio.wait_all_tasks_blocked()
        release.set()
    assert idle == [0]  # once, after b: not when a passed the slot on
    await turn("c", 1)
    assert idle == [0, 1]


async def test_idle_means_nothing_holds_or_waits_for_any_slot() -> None:
    scheduler = Scheduler()
    assert scheduler.idle()
    release = anyio.Event()
    seen: list[bool] = []

    async def hold(session: str, slot: int) -> None:
        async with scheduler.slot(session, slot):
            await release.wait()

    async with anyio.create_task_group() as tg:
        tg.start_soon(hold, "a", 0)
        await anyio.wait_all_tasks_blocked()
        seen.append(scheduler.idle())  # a holds slot 0
        tg.start_soon(hold, "b", 0)
        await anyio.wait_all_tasks_blocked()
        release.set()
    seen.append(scheduler.idle())
    assert seen == [False, True]
