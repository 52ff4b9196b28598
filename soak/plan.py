"""What a run will do, drawn from its seed before it starts: the threads (who, where, what kind
of conversation) and the faults (which, when). Pure, so one seed gives one plan.

Every fault kind is drawn once first (in a shuffled order), then at random: a run shorter than the
kinds' number of fault slots would fail its "every kind fired" check, so the plan makes at least
that many slots.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import StrEnum


class FaultKind(StrEnum):
    LOOPD_KILL = "loopd SIGKILL"
    BROKERD_KILL = "brokerd SIGKILL"
    LLAMA_CHILD_KILL = "llama-server child SIGKILL"
    LLAMA_RESTART = "llama-server SIGKILL and restart"
    WS_DROP = "WebSocket drop"
    BURST_429 = "429 burst"
    BURST_5XX = "5xx burst"
    EDIT_REFUSED = "status edit refused"
    STREAM_SILENT = "silent stream"
    STREAM_SLOW = "slow stream"
    DISK_FULL = "disk full"


# The faults after which the server holds no session: the model child killed (the router starts
# it again on the next request), the whole server killed and started again. Durable sessions'
# figures count the returns after these.
SERVER_KILLS = frozenset({FaultKind.LLAMA_CHILD_KILL, FaultKind.LLAMA_RESTART})


class Place(StrEnum):
    DM = "dm"
    TOWN_SQUARE = "town-square"
    DEV = "dev"


class Style(StrEnum):
    PLAIN = "plain"  # short questions
    TOOLS = "tools"  # most messages ask for tool calls
    LONG = "long"  # long messages: the session compacts


@dataclass(frozen=True)
class ThreadPlan:
    name: str  # t00, t01, ...
    user: str
    place: Place
    style: Style
    start_s: float  # when its first message is posted, from the start of the load


@dataclass(frozen=True)
class FaultPlan:
    at_s: float
    kind: FaultKind


@dataclass(frozen=True)
class Plan:
    seed: int
    seconds: float
    users: tuple[str, ...]
    threads: tuple[ThreadPlan, ...]
    faults: tuple[FaultPlan, ...]


# Faults fall inside this share of the load phase: the first seconds let every thread start, the
# last let the run end on a system that is not mid-fault. A run of CALM_FROM_S or more starts with
# a longer calm, so turns without faults have a baseline to be compared with.
FAULT_WINDOW = (0.08, 0.85)
CALM_FROM_S = 300.0
CALM_SHARE = 0.2
FAULT_EVERY_S = 20.0  # one fault on average this often, once every kind has had its turn


def make_plan(seed: int, seconds: float, thread_count: int) -> Plan:
    rng = random.Random(seed)
    users = tuple(f"u{i:02d}" for i in range((thread_count + 1) // 2))
    threads = []
    for i in range(thread_count):
        place = Place.DM if i % 2 == 0 else (Place.TOWN_SQUARE, Place.DEV)[(i // 2) % 2]
        threads.append(
            ThreadPlan(
                name=f"t{i:02d}",
                user=users[i % len(users)],
                place=place,
                style=_style(i),
                start_s=round(rng.uniform(0.0, min(10.0, seconds * 0.1)), 2),
            )
        )
    return Plan(seed, seconds, users, tuple(threads), _faults(rng, seconds))


def _style(index: int) -> Style:
    """About two in five threads call tools, one in five is long enough to compact."""
    match index % 5:
        case 1 | 3:
            return Style.TOOLS
        case 2:
            return Style.LONG
        case _:
            return Style.PLAIN


def fault_window(seconds: float) -> tuple[float, float]:
    """The share of the load phase the faults fall in."""
    calm = CALM_SHARE if seconds >= CALM_FROM_S else FAULT_WINDOW[0]
    return (calm, FAULT_WINDOW[1])


def _faults(rng: random.Random, seconds: float) -> tuple[FaultPlan, ...]:
    kinds = list(FaultKind)
    rng.shuffle(kinds)
    count = max(len(kinds), round(seconds / FAULT_EVERY_S))
    kinds += [rng.choice(list(FaultKind)) for _ in range(count - len(kinds))]
    start, end = (seconds * share for share in fault_window(seconds))
    step = (end - start) / count
    return tuple(
        FaultPlan(round(start + step * i + rng.uniform(0.0, step * 0.5), 2), kind)
        for i, kind in enumerate(kinds)
    )
