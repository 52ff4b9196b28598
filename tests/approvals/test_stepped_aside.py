"""A session that steps aside (waiting for a person) lets the next in line run, and then
holds its slot again behind those already waiting."""

from __future__ import annotations

import anyio
import pytest

from loopd.scheduler import Scheduler

pytestmark = pytest.mark.anyio


async def test_the_next_session_runs_while_one_waits_for_a_person() -> None:
    scheduler = Scheduler()
    order: list[str] = []
    decided = anyio.Event()

    async def other() -> None:
        async with scheduler.slot("b", 0):
            order.append("b runs")
            decided.set()  # the person answers while b runs

    async with scheduler.slot("a", 0), anyio.create_task_group() as tg:
        tg.start_soon(other)
        await anyio.sleep(0.01)
        assert scheduler.position("b", 0) == 1  # b waits behind a
        async with scheduler.stepped_aside("a", 0):
            await decided.wait()
        order.append("a holds it again")
        assert scheduler.holder(0) == "a"
    assert order == ["b runs", "a holds it again"]
    assert scheduler.idle()


async def test_a_stop_while_waiting_to_hold_it_again_leaves_the_slot_to_its_holder() -> None:
    scheduler = Scheduler()
    b_holds = anyio.Event()
    b_done = anyio.Event()

    async def other() -> None:
        async with scheduler.slot("b", 0):
            b_holds.set()
            await b_done.wait()

    async with anyio.create_task_group() as tg:
        async with scheduler.slot("a", 0):
            tg.start_soon(other)
            await anyio.sleep(0.01)
            with anyio.move_on_after(0.1):  # a stop while a waits to come back
                async with scheduler.stepped_aside("a", 0):
                    await b_holds.wait()
        assert scheduler.holder(0) == "b"  # a's leaving did not release b's hold
        b_done.set()
    assert scheduler.idle()
