"""Which endpoints are up, and when a down one is checked again. Pure: the caller passes the
clock readings in, and does the checking.

An endpoint is up once its self-test passes (at start, or on a re-check) and down when:

- its self-test fails (unreachable, or a server other than the recorded one);
- a request to it fails in a way that says the server is dead, not busy: nothing answers at its
  URL, or ``/slots`` and ``/health`` both fail while the request waits for its first byte (the
  engine's ``/slots`` rule, ``loopd.engine.liveness``), or the stream is cut and ``/health`` no
  longer answers. A request that is only queued (the first-byte limit passed while the server
  answered) says the server is busy, and the endpoint stays up.

A down endpoint is checked again by the re-check rule (``loopcommon.backoff.RECHECK``): 2 s,
doubling to a minute, so a server that restarts is back within a minute, and a dead one costs a
failed connection a minute.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final

from loopcommon.backoff import RECHECK
from loopd.engine.outcome import Failure

# Failures that mean nothing answers at the endpoint: no connection, or /slots and /health both
# failing while the request waited.
DEAD_FAILURES: Final = frozenset({Failure.UNREACHABLE, Failure.SERVER_GONE})
# Failures that mean the server may have died mid-request: dead if /health no longer answers.
MAYBE_DEAD_FAILURES: Final = frozenset({Failure.TRUNCATED, Failure.SILENCE})


def endpoint_dead(cause: Failure | None, health_answers: bool | None = None) -> bool:
    """Whether a request that failed with ``cause`` shows its endpoint dead. ``health_answers``:
    whether ``/health`` answered after the failure (None: not asked); asked for a cut stream."""
    if cause in DEAD_FAILURES:
        return True
    return cause in MAYBE_DEAD_FAILURES and health_answers is False


def needs_health_check(cause: Failure | None) -> bool:
    """Whether ``endpoint_dead`` needs ``/health`` asked to judge this failure."""
    return cause in MAYBE_DEAD_FAILURES


@dataclass(frozen=True)
class Down:
    reason: str  # one line: why it is down
    since: float
    failed_checks: int
    next_check: float


class EndpointHealth:
    """The up or down state of each configured endpoint, in the configured order."""

    def __init__(self, names: Iterable[str]) -> None:
        self.names: tuple[str, ...] = tuple(names)
        self._down: dict[str, Down] = {}
        self._down_listeners: list[Callable[[str], None]] = []

    def on_down(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(name)`` whenever an endpoint that was up is marked down."""
        self._down_listeners.append(listener)

    def is_up(self, name: str) -> bool:
        return name in self.names and name not in self._down

    def up(self) -> tuple[str, ...]:
        return tuple(name for name in self.names if name not in self._down)

    def down(self, name: str) -> Down | None:
        return self._down.get(name)

    def mark_down(self, name: str, reason: str, now: float) -> bool:
        """The endpoint failed (a check or a request); True when it was up until now. A second
        failure while it is down changes nothing: its re-checks keep their schedule."""
        if name in self._down:
            return False
        self._down[name] = Down(reason, now, 1, now + RECHECK.delay(1))
        for listener in self._down_listeners:
            listener(name)
        return True

    def check_failed(self, name: str, reason: str, now: float) -> None:
        """A re-check of a down endpoint failed: the next one waits longer."""
        previous = self._down.get(name)
        failed = previous.failed_checks + 1 if previous is not None else 1
        since = previous.since if previous is not None else now
        self._down[name] = Down(reason, since, failed, now + RECHECK.delay(failed))

    def mark_up(self, name: str) -> bool:
        """The endpoint passed its check; True when it was down until now."""
        return self._down.pop(name, None) is not None

    def due(self, now: float) -> list[str]:
        """The down endpoints whose re-check is due, in the configured order."""
        return [name for name in self.names if (d := self._down.get(name)) and d.next_check <= now]

    def next_check(self) -> float | None:
        """When the next re-check is due; None when every endpoint is up."""
        return min((d.next_check for d in self._down.values()), default=None)
