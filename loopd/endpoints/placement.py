"""Which server a session's turn runs on, when loopd has several. Pure: no I/O, no clock.

A session's cache lives on the server that read its prompt (in a slot, or in that server's host
prompt cache on a unified pool: docs/production-shape.md), and moving it costs one full re-read.
So a session stays on its endpoint for life while that endpoint is up, and placement decides two
things only:

- **a new session** (or one whose endpoint is gone) goes to the endpoint with the fewest waiting
  turns plus active sessions. A tie goes to the endpoint whose cache holds more of the session's
  system prompt and tools when the caller knows that count (``shared_tokens``), and otherwise to
  the first endpoint in the configured order;
- **a placed session** stays, unless its endpoint is down: then it moves, and the request that
  re-reads its whole prompt on the new endpoint is recorded with the cause ``endpoint lost``.

Within an endpoint, the engine's own rule chooses the slot (pinned) or lane (unpinned).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from loopd.engine.cacheloss import LossCause


@dataclass(frozen=True)
class EndpointLoad:
    """One endpoint as placement sees it, now."""

    name: str
    up: bool
    waiting_turns: int = 0  # turns queued for this endpoint, not yet running
    active_sessions: int = 0  # sessions placed here that are running or were active lately
    # Tokens of the new session's system prompt and tools this endpoint's cache holds, by the
    # server's own counts; None when not known (then the configured order breaks a tie).
    shared_tokens: int | None = None

    @property
    def load(self) -> int:
        return self.waiting_turns + self.active_sessions


def choose_endpoint(loads: Sequence[EndpointLoad]) -> str | None:
    """The endpoint for a new session: the least loaded of those up, ties to the one holding
    more of the session's shared prefix, then to the earlier one. None when none is up."""
    up = [(index, load) for index, load in enumerate(loads) if load.up]
    if not up:
        return None
    _, best = min(up, key=lambda pair: (pair[1].load, -(pair[1].shared_tokens or 0), pair[0]))
    return best.name


@dataclass(frozen=True)
class Stay:
    """The session's turn runs on its endpoint."""

    endpoint: str


@dataclass(frozen=True)
class Move:
    """The session's turn runs on ``to``. ``lost``: the endpoint it leaves (down, or gone from
    the configuration), whose cache it loses; None for a session placed for the first time."""

    to: str
    lost: str | None = None

    @property
    def cause(self) -> LossCause | None:
        """The cause its first request on ``to`` is recorded with, when it re-reads there."""
        return LossCause.ENDPOINT_LOST if self.lost is not None else None


@dataclass(frozen=True)
class NowhereUp:
    """No endpoint is up: the turn cannot run now."""

    down: tuple[str, ...]


Placement = Stay | Move | NowhereUp


def place_turn(current: str | None, loads: Sequence[EndpointLoad]) -> Placement:
    """Where a session's next turn runs: its own endpoint while that is up; else the endpoint a
    new session would get."""
    by_name = {load.name: load for load in loads}
    own = by_name.get(current) if current is not None else None
    if own is not None and own.up:
        return Stay(own.name)
    others = [load for load in loads if load.name != current]
    target = choose_endpoint(others)
    if target is None:
        return NowhereUp(tuple(load.name for load in loads))
    return Move(target, lost=current)
