"""The status page's data, read from the runtime: slots, live turns and sessions.

``snapshot`` reads the runtime (its servers' slots, its live turns, its session log) into the page's
plain data (``loopcommon.statuspage``, which also renders it, with no I/O).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Final

from loopcommon.statuspage import (
    MAX_SESSIONS,
    PLOT_POINTS,
    LiveView,
    SessionView,
    SlotView,
    StatusSnapshot,
    ThreadView,
    WaitView,
    bounded,
)
from loopd.engine.modelstate import ModelStatus
from loopd.engine.waits import WAIT_PARTS, person_wait_ms
from loopd.observe.perfsummary import PART_WORDS, percentile, summarize
from loopd.sessionlog.records import Request, RequestKind
from loopd.sessions import Runtime

WAIT_TURNS: Final = 100  # the latest turns the wait for the first token is over
PREWARM_PREFIX: Final = "prewarm:"  # the scheduler holds a slot for a prewarm under this name


def snapshot(
    runtime: Runtime, now: float | None = None, threads: Mapping[str, ThreadView] = {}
) -> StatusSnapshot:
    """What the page shows, read from the runtime now, within the page's bounds
    (``statuspage.bounded``); ``threads``: the Mattermost threads' labels, by session name."""
    wall = time.time() if now is None else now
    live = runtime.live.all()
    phases = {turn.session: turn.phase for turn in live}
    slots = []
    for server in runtime.endpoints.servers.values():  # each server's slots, in turn
        for slot in server.endpoint.slots:
            holder = server.scheduler.holder(slot)
            phase = phases.get(holder) if holder is not None else None
            if holder is not None and holder.startswith(PREWARM_PREFIX):
                holder, phase = holder[len(PREWARM_PREFIX) :], "prewarm"
            in_line = sum(1 for turn in live if turn.slot == slot and not turn.holding)
            slots.append(SlotView(slot, holder, phase, in_line))
    live_views = tuple(
        LiveView(t.session, t.slot, t.phase, max(wall - t.started_at, 0.0), t.holding, t.ahead)
        for t in live
    )
    listed = runtime.log.sessions()
    requests = {s.name: runtime.log.requests(s.name) for s in listed}
    sessions = [
        session_view(s.name, s.slot, requests[s.name], phases.get(s.name), threads.get(s.name))
        for s in listed
    ]
    sessions.sort(key=lambda v: (v.phase is not None, v.last_turn_at or ""), reverse=True)
    snap = StatusSnapshot(
        generated_at=_stamp(wall),
        model=", ".join(server.endpoint.model for server in runtime.endpoints.servers.values()),
        slots=tuple(slots),
        live=live_views,
        sessions=tuple(sessions[:MAX_SESSIONS]),
        model_state=_model_state([s.memory.status for s in runtime.endpoints.servers.values()]),
        waits=wait_view([r for rows in requests.values() for r in rows]),
    )
    return bounded(snap)


def wait_view(requests: Sequence[Request], latest: int = WAIT_TURNS) -> WaitView | None:
    """The wait for the first token over the ``latest`` turns that recorded theirs."""
    waited = sorted(
        (r for r in requests if person_wait_ms(r.record.perf.extra) is not None),
        key=lambda r: r.created_at,
    )[-latest:]
    if not waited:
        return None
    summary = summarize(waited)
    parts = tuple(
        (PART_WORDS[name], percentile(summary.wait_parts_ms[name], 50)) for name in WAIT_PARTS
    )
    return WaitView(
        turns=len(summary.waits_ms),
        p50_ms=percentile(summary.waits_ms, 50),
        p95_ms=percentile(summary.waits_ms, 95),
        parts_p50_ms=parts,
    )


def session_view(
    name: str,
    slot: int,
    requests: Sequence[Request],
    phase: str | None,
    thread: ThreadView | None = None,
) -> SessionView:
    summary = summarize(requests)
    turns = [r for r in requests if r.record.kind is RequestKind.TURN]
    prompt_n = tuple(
        r.record.perf.prompt_n
        for r in requests
        if r.record.kind is not RequestKind.SELFTEST and r.record.perf.prompt_n is not None
    )
    return SessionView(
        name=name,
        slot=slot,
        requests=len(requests),
        last_turn_at=turns[-1].created_at if turns else None,
        hit_rate=summary.hit_rate,
        prompt_n=prompt_n[-PLOT_POINTS:],
        phase=phase,
        thread=thread,
    )


def _model_state(statuses: Sequence[ModelStatus]) -> str:
    """Each server's model's state as the page says it, in the order of the models' names (one
    word where they agree); "" where loopd has not read any."""
    if all(status is ModelStatus.UNKNOWN for status in statuses):
        return ""
    words = [status.value for status in statuses]
    return words[0] if len(set(words)) == 1 else ", ".join(words)


def _stamp(wall: float) -> str:
    return datetime.fromtimestamp(wall, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
