"""The status page's data is bounded by its types: the largest data they allow fits in
``STATUS_MAX_BYTES`` and renders within ``PAGE_MAX_BYTES``; data past any bound is refused with
one line naming where; loopd's own data is cut to the bounds, so brokerd never refuses it."""

from __future__ import annotations

import json
import time
from dataclasses import replace

import pytest

from brokerd.observe.statuspage import NotAStatus, render_status
from loopcommon.statuspage import (
    MAX_COUNT,
    MAX_LIVE,
    MAX_SESSIONS,
    MAX_SLOTS,
    MAX_TEXT,
    PAGE_MAX_BYTES,
    PLOT_POINTS,
    STATUS_MAX_BYTES,
    LiveView,
    SessionView,
    SlotView,
    StatusSnapshot,
    ThreadView,
    bounded,
)

WIDE = "\u7121" * MAX_TEXT  # the widest string: three bytes a character
# The widest on the page: four bytes a character, shown as a label (``&lt;U+E0041&gt;``).
HIDDEN = "\U000e0041" * MAX_TEXT


def largest(extra: int = 0, wide: str = WIDE) -> StatusSnapshot:
    """The largest status data the bounds allow (``extra``: that many past each list's), each
    string ``wide``."""
    thread = ThreadView("a" * 26, wide, wide, wide)
    session = SessionView(
        wide, MAX_COUNT, MAX_COUNT, wide, 0.5, (MAX_COUNT,) * PLOT_POINTS, wide, thread
    )
    return StatusSnapshot(
        generated_at=wide,
        model=wide,
        slots=(SlotView(MAX_COUNT, wide, wide, MAX_COUNT),) * (MAX_SLOTS + extra),
        live=(LiveView(wide, MAX_COUNT, wide, 1e9, False, MAX_COUNT),) * (MAX_LIVE + extra),
        sessions=(session,) * (MAX_SESSIONS + extra),
    )


def encoded(snap: StatusSnapshot) -> bytes:
    """As loopd serves it (starlette's ``JSONResponse``)."""
    return json.dumps(snap.as_json(), ensure_ascii=False, separators=(",", ":")).encode()


@pytest.mark.parametrize("wide", [WIDE, HIDDEN], ids=["wide", "hidden"])
def test_the_largest_valid_status_fits_and_renders_within_its_bounds(wide: str) -> None:
    data = encoded(largest(wide=wide))
    started = time.perf_counter()
    page = render_status(data)
    took = time.perf_counter() - started
    print(f"largest status data {len(data):,} bytes; page {len(page):,} bytes in {took:.3f} s")
    assert len(data) <= STATUS_MAX_BYTES
    assert len(page) <= PAGE_MAX_BYTES


def over(snap: StatusSnapshot, where: str) -> StatusSnapshot:
    """``snap`` with one bound passed, at ``where``."""
    session = snap.sessions[0]
    match where:
        case "points":
            return replace(snap, sessions=(replace(session, prompt_n=(1,) * (PLOT_POINTS + 1)),))
        case "text":
            return replace(snap, model="m" * (MAX_TEXT + 1))
        case "count":
            return replace(snap, sessions=(replace(session, requests=MAX_COUNT + 1),))
        case _:
            return replace(snap, **{where: getattr(largest(extra=1), where)})


@pytest.mark.parametrize(
    ("where", "named"),
    [
        ("slots", "slots"),
        ("live", "live"),
        ("sessions", "sessions"),
        ("points", "sessions.0.prompt_n"),
        ("text", "model"),
        ("count", "sessions.0.requests"),
    ],
)
def test_data_past_a_bound_is_refused_naming_where(where: str, named: str) -> None:
    snap = largest()
    small = replace(snap, slots=snap.slots[:1], live=snap.live[:1], sessions=snap.sessions[:1])
    with pytest.raises(NotAStatus) as refused:
        render_status(encoded(over(small, where)))
    print(refused.value)
    assert f"the first at {named}:" in str(refused.value)


def test_loopds_data_is_cut_to_the_bounds() -> None:
    too_much = replace(
        largest(extra=5),
        model="m" * 5000,
        sessions=tuple(
            replace(s, name="s" * 5000, prompt_n=tuple(range(500))) for s in largest(5).sessions
        ),
    )
    cut = bounded(too_much)
    render_status(encoded(cut))  # valid: no NotAStatus
    assert len(cut.sessions) == MAX_SESSIONS
    assert cut.sessions[0].prompt_n == tuple(range(500 - PLOT_POINTS, 500))
    assert cut.model == "m" * MAX_TEXT
    assert bounded(cut) == cut
