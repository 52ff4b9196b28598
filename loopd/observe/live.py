"""The turns under way, as the status page shows them: which slot, waiting or running, and the
phase of the request in flight.

``Runtime.run_turn`` enters ``LiveTurns.turn`` around each turn and hands the engine the entry's
``report`` and ``on_position`` in place of the front end's (which are still called). The entry
also times the wait for the slot and counts the turn's outcome in the metrics when it ends. A phase
is worded as on every other surface (``loopd.engine.progress.phase_words``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Final

from loopd.engine.outcome import TurnOutcome
from loopd.engine.progress import Status, StatusCallback, phase_words
from loopd.observe.metrics import METRICS, LoopdMetrics
from loopd.requestscope import session_scope
from loopd.scheduler import PositionCallback

AWAITING_PERSON: Final = "waiting for a person's approval"


@dataclass
class LiveTurn:
    session: str
    slot: int
    started_at: float  # wall clock, for the page
    asked_at: float  # monotonic: when the turn asked for its slot
    phase: str = "in line"  # until the slot is ours: waiting behind other sessions
    ahead: int = 0  # sessions ahead of it on its slot, while in line
    holding: bool = False  # the slot is this turn's
    outcome: TurnOutcome | None = None
    report_to: StatusCallback = field(default=lambda status: None)
    position_to: PositionCallback = field(default=lambda ahead: None)
    metrics: LoopdMetrics = METRICS
    clock: Callable[[], float] = time.monotonic

    def report(self, status: Status) -> None:
        self.phase = phase_words(status)  # the wording every surface uses
        self.report_to(status)

    def on_position(self, ahead: int) -> None:
        self.ahead = ahead
        if ahead == 0 and not self.holding:
            self.holding = True
            self.phase = "starting"
            self.metrics.slot_waited(self.slot, self.clock() - self.asked_at)
        elif ahead:
            self.phase = "in line"
        self.position_to(ahead)

    @contextmanager
    def awaiting_person(self) -> Iterator[None]:
        """While a person decides on one of the turn's calls (its slot another's meanwhile), the
        status page says so, not the call's phase; then the turn is where it was."""
        before = self.phase
        self.phase = AWAITING_PERSON
        try:
            yield
        finally:
            self.phase = before

    def finished(self, outcome: TurnOutcome) -> TurnOutcome:
        self.outcome = outcome
        return outcome

    def outcome_label(self) -> str:
        if self.outcome is None:
            return "cancelled"
        return "answered" if self.outcome.answer is not None else "failed"


class LiveTurns:
    """The runtime's turns under way, by session (a session runs one turn at a time)."""

    def __init__(self, metrics: LoopdMetrics = METRICS) -> None:
        self.metrics = metrics
        self._turns: dict[str, LiveTurn] = {}

    @contextmanager
    def turn(
        self,
        session: str,
        slot: int,
        report: StatusCallback,
        on_position: PositionCallback,
    ) -> Iterator[LiveTurn]:
        """One turn, from asking for its slot to its end; its lines are logged with its
        session (``loopd.requestscope``)."""
        live = LiveTurn(
            session,
            slot,
            started_at=time.time(),
            asked_at=time.monotonic(),
            report_to=report,
            position_to=on_position,
            metrics=self.metrics,
        )
        self._turns[session] = live
        try:
            with session_scope(session):
                yield live
        finally:
            if self._turns.get(session) is live:
                del self._turns[session]
            compacted = live.outcome is not None and live.outcome.compacted
            self.metrics.turn_ended(live.outcome_label(), compacted=compacted)

    def get(self, session: str) -> LiveTurn | None:
        return self._turns.get(session)

    def all(self) -> list[LiveTurn]:
        return sorted(self._turns.values(), key=lambda live: live.started_at)
