"""What the endpoints need of the runtime the front ends share (``loopd.sessions.Runtime``).

A protocol, so that the endpoints depend on these few things and not on the runtime, which is
built on them: the runtime opens the endpoints, the endpoints run its turns.
"""

from __future__ import annotations

from typing import Protocol

from loopd.config import Settings
from loopd.contextwindow.budget import BudgetRules
from loopd.engine.progress import StatusCallback
from loopd.engine.turn import Turn
from loopd.observe.live import LiveTurns
from loopd.sessionlog.records import Session
from loopd.sessionlog.store import SessionLog


class SessionRuntime(Protocol):
    @property
    def settings(self) -> Settings: ...

    @property
    def log(self) -> SessionLog: ...

    @property
    def live(self) -> LiveTurns:
        """The turns under way, which the status page shows."""

    def turn(self, session: Session, report: StatusCallback) -> Turn:
        """The session's next turn as on one server; the endpoints aim it at theirs."""

    def budget_rules(self) -> BudgetRules: ...

    def new_session_head(self) -> tuple[str, str]:
        """What a new session's epoch begins with: its tools (their sha256) and system text."""
