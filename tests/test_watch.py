"""The helper that watches bounds (``tests.watch``) sees what it is meant to: memory a child took
and a stall of its event loop. The scenarios are this module's own functions."""

from __future__ import annotations

import time

import anyio

from tests.watch import MIB, Heartbeat, run_watched, under_heartbeat

HELD = 64 * MIB
STALL_S = 0.3


async def holds_memory(size: str) -> int:
    """Touch ``size`` bytes and keep them until the scenario ends."""
    block = bytearray(int(size))
    block[::4096] = b"x" * len(block[::4096])
    return len(block)


async def holds_the_loop(seconds: str) -> str:
    time.sleep(float(seconds))  # noqa: ASYNC251 (what a synchronous read on the loop does)
    return "held"


def test_a_childs_memory_is_seen() -> None:
    watched = run_watched("tests.test_watch:holds_memory", str(HELD))
    print(watched.line)
    assert watched.result == HELD
    assert watched.growth >= HELD * 0.9  # what the child held before it is counted apart
    assert watched.longest_stall_s < 60  # a number, measured


def test_a_childs_loop_stall_is_seen() -> None:
    watched = run_watched("tests.test_watch:holds_the_loop", str(STALL_S))
    print(watched.line)
    assert watched.result == "held"
    assert watched.longest_stall_s >= STALL_S - 0.01
    assert watched.growth < HELD


def test_a_heartbeat_in_this_process() -> None:
    async def main() -> tuple[object, float]:
        async def stall() -> None:
            await anyio.sleep(0.05)
            time.sleep(STALL_S)  # noqa: ASYNC251 (the stall to be seen)

        return await under_heartbeat(stall())

    _, stall = anyio.run(main)
    assert stall >= STALL_S - 0.01
    assert Heartbeat().longest_stall_s == 0.0
