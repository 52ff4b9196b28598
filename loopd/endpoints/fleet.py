"""Where every session is, and how loaded each endpoint is: the state placement decides on.

The session log is the truth about where a session's cache is (the endpoint of its latest
request, ``SessionLog.last_endpoints``); ``Fleet`` reads it once at start and then keeps it as
turns are placed. Load is counted here too: the turns waiting for an endpoint (queued behind its
slots or lanes) and its *active* sessions, those placed on it that ran a request within
``ACTIVE_WINDOW_S`` or have a turn under way. A session quiet for longer still stays on its
endpoint when it comes back (its cache is there); it only stops counting as that endpoint's load.
What each endpoint's cache holds of the system prompt and tools every new session begins with is
learnt from the sessions' first prompts there (until that endpoint dies), for placement's
tie-break.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime

from loopd.endpoints.health import EndpointHealth
from loopd.endpoints.placement import EndpointLoad, Move, Placement, place_turn

# A session that ran a request within this long counts as its endpoint's load. An hour: a team's
# thread that is being worked on comes back within minutes; one quiet for an hour is done for now.
ACTIVE_WINDOW_S = 3600.0


def parse_recorded_at(text: str) -> float:
    """A log timestamp (ISO 8601 with its offset) as seconds since the epoch; 0 if unreadable."""
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return 0.0


class Fleet:
    """The endpoints' health and load, and each session's endpoint."""

    def __init__(
        self,
        names: Sequence[str],
        *,
        placed: Mapping[str, tuple[str, str]] = {},
        health: EndpointHealth | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``placed``: ``SessionLog.last_endpoints()``, each session's endpoint and when it last
        ran there."""
        self.names = tuple(names)
        self.health = health or EndpointHealth(self.names)
        self._clock = clock
        self._endpoint: dict[str, str] = {name: where for name, (where, _) in placed.items()}
        self._active_at: dict[str, float] = {
            name: parse_recorded_at(at) for name, (_, at) in placed.items()
        }
        self._waiting: Counter[str] = Counter()  # endpoint -> turns queued for it
        self._running: Counter[str] = Counter()  # session -> turns under way (0 or 1)
        # endpoint -> tokens of the shared system prompt and tools its cache holds, by the
        # server's counts (``holds_head``); absent: not known (placement's tie-break).
        self._head: dict[str, int] = {}
        # A server that died lost its cache: it holds nothing until a session reads there again.
        self.health.on_down(lambda name: self._head.__setitem__(name, 0))

    def endpoint_of(self, session: str) -> str | None:
        return self._endpoint.get(session)

    def is_running(self, session: str) -> bool:
        """A turn of ``session`` is under way (``running``)."""
        return self._running[session] > 0

    def sessions_on(self, endpoint: str) -> list[str]:
        return [name for name, where in self._endpoint.items() if where == endpoint]

    def loads(self) -> list[EndpointLoad]:
        """Each endpoint as placement sees it now, in the configured order."""
        now = self._clock()
        active: Counter[str] = Counter()
        for session, where in self._endpoint.items():
            recent = now - self._active_at.get(session, 0.0) <= ACTIVE_WINDOW_S
            if recent or self._running[session]:
                active[where] += 1
        return [
            EndpointLoad(
                name,
                self.health.is_up(name),
                self._waiting[name],
                active[name],
                self._head.get(name),
            )
            for name in self.names
        ]

    def holds_head(self, endpoint: str, tokens: int) -> None:
        """``endpoint`` read a prompt that begins with the new sessions' system prompt and tools,
        at most ``tokens`` of it shared (``engine.cacheloss.shared_head_bound``)."""
        self._head[endpoint] = max(self._head.get(endpoint, 0), tokens)

    def place(self, session: str) -> Placement:
        """Where the session's turn runs now (``placement.place_turn``); a Move is kept as the
        session's new endpoint at once, so the next new session counts it there."""
        placement = place_turn(self._endpoint.get(session), self.loads())
        if isinstance(placement, Move):
            self._endpoint[session] = placement.to
            self._active_at[session] = self._clock()
        return placement

    @contextmanager
    def waiting(self, endpoint: str) -> Iterator[None]:
        """A turn queued for ``endpoint`` (until it gets its slot or lane)."""
        self._waiting[endpoint] += 1
        try:
            yield
        finally:
            self._waiting[endpoint] -= 1

    @contextmanager
    def running(self, session: str) -> Iterator[None]:
        """A turn of ``session`` under way; it counts as active until then and for the window
        after."""
        self._running[session] += 1
        try:
            yield
        finally:
            self._running[session] -= 1
            self._active_at[session] = self._clock()
