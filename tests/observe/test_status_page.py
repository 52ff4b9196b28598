"""The status page's rendering: pure, escaped, self-refreshing, with its inline plots."""

from __future__ import annotations

import html
import re

from loopcommon.statuspage import (
    LiveView,
    SessionView,
    SlotView,
    StatusSnapshot,
    WaitView,
    bounded,
    render,
    sparkline,
    when,
)
from loopd.chat.status import status_text
from loopd.engine.progress import Phase, Status, phase_words
from loopd.engine.waits import WAIT_PARTS
from loopd.observe.live import LiveTurn
from loopd.sessionlog.records import Perf, Request, RequestKind, RequestRecord
from loopd.status.page import wait_view


def snapshot(**changes: object) -> StatusSnapshot:
    values: dict[str, object] = {
        "generated_at": "2026-05-01T12:00:00Z",
        "model": "smollm2",
        "slots": (SlotView(0, "mm:abc", "reading the prompt 40%", 1), SlotView(1, None, None, 0)),
        "live": (
            LiveView("mm:abc", 0, "reading the prompt 40%", 12.4, True, 0),
            LiveView("mm:def", 0, "in line", 3.0, False, 1),
        ),
        "sessions": (
            SessionView(
                "mm:abc",
                0,
                4,
                "2026-05-01T11:59:07.123456+00:00",
                0.91,
                (120, 40, 44),
                "reading the prompt 40%",
            ),
        ),
    }
    values.update(changes)
    return StatusSnapshot(**values)  # type: ignore[arg-type]


def text_of(page: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page))


def test_the_page_shows_slots_live_turns_and_sessions() -> None:
    page = render(snapshot())
    text = text_of(page)
    assert '<meta http-equiv="refresh" content="5">' in page
    assert "<script" not in page
    assert " 0 busy mm:abc reading the prompt 40% 1 " in text
    assert " 1 idle " in text
    assert " mm:def 0 in line (1 ahead) 3 s " in text
    assert " mm:abc 0 reading the prompt 40% 12 s " in text
    assert " mm:abc 0 2026-05-01 11:59:07Z 4 91% " in text
    assert page.count("<svg") == 1


def test_hostile_names_are_escaped() -> None:
    name = '<img src=x onerror="alert(1)">'
    page = render(
        snapshot(
            slots=(SlotView(0, name, "<b>", 0),),
            live=(LiveView(name, 0, "<b>", 1.0, True, 0),),
            sessions=(SessionView(name, 0, 0, None, None, (), None),),
        )
    )
    assert "<img" not in page
    assert "<b>" not in page
    assert "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in page


def test_empty_states_say_so() -> None:
    text = text_of(render(snapshot(live=(), sessions=())))
    assert "no turn is under way" in text
    assert "no sessions yet" in text


def test_the_sparkline_scales_to_the_largest_value() -> None:
    svg = sparkline([0, 50, 100], width=100, height=24)
    points = re.search(r'points="([^"]+)"', svg)
    assert points is not None
    xy = [tuple(float(n) for n in p.split(",")) for p in points.group(1).split()]
    assert xy == [(0.0, 22.0), (50.0, 12.0), (100.0, 2.0)]
    assert "max 100" in svg
    assert "none" in sparkline([])
    assert "<polyline" in sparkline([7])  # one request: one point


def test_a_live_turn_words_its_phase_as_every_other_surface() -> None:
    live = LiveTurn("mm:abc", 0, started_at=0.0, asked_at=0.0)
    for status in (
        Status(Phase.READING, percent=40),
        Status(Phase.THINKING, tokens=12),
        Status(Phase.TOOL_CALL, tool="read_file"),
        Status(Phase.QUEUED),
    ):
        live.report(status)
        assert live.phase == phase_words(status)
        assert status_text(status).endswith(live.phase)  # the thread's post: an icon, then this
    assert live.phase == "queued behind another request on the server"


def test_times_in_words() -> None:
    assert when("2026-05-01T13:00:00+01:00") == "2026-05-01 12:00:00Z"
    assert when(None) == ""


def test_the_wait_people_saw_comes_first() -> None:
    waits = WaitView(
        turns=12,
        p50_ms=1234.0,
        p95_ms=61_500.0,
        parts_p50_ms=(("in loopd's queue", 0.0), ("reading the prompt", 1180.4)),
    )
    page = render(snapshot(waits=waits))
    text = html.unescape(text_of(page))
    assert " p50 1.2 s · p95 1 min 2 s over the latest 12 turns " in text
    assert " p50 of each part: in loopd's queue 0 ms; reading the prompt 1.2 s " in text
    assert page.index("The wait for the first token") < page.index("Slots")
    assert bounded(snapshot(waits=waits)).waits == waits  # what loopd serves keeps it
    assert " no turn has recorded its wait yet " in text_of(render(snapshot()))


def test_the_wait_is_over_the_latest_turns_that_recorded_it() -> None:
    def turn(wait_ms: float | None, at: str) -> Request:
        extra = {} if wait_ms is None else {name: wait_ms / 4 for name in WAIT_PARTS}
        perf = Perf(outcome="complete", extra=extra)
        record = RequestRecord(RequestKind.TURN, 0, 1, 1, f"{at}", perf)
        return Request(id=1, session_id=1, record=record, created_at=at)

    requests = [turn(100.0 * i, f"2026-05-01T12:00:{i:02d}Z") for i in range(1, 11)]
    requests.append(turn(None, "2026-05-01T12:00:59Z"))  # a follow-up: no wait of its own
    view = wait_view(requests, latest=4)
    assert view is not None
    assert (view.turns, view.p50_ms, view.p95_ms) == (4, 800.0, 1000.0)
    assert [what for what, _ in view.parts_p50_ms] == [
        "in loopd's queue",
        "in the server's queue",
        "reading the prompt",
        "the first token",
    ]
    assert wait_view(requests[-1:]) is None


def test_the_model_asleep_or_unloaded_is_shown_beside_its_name() -> None:
    asleep = text_of(render(snapshot(model_state="asleep")))
    assert "model smollm2 asleep ·" in asleep
    assert "model smollm2 (awake) ·" in text_of(render(snapshot(model_state="awake")))
    assert "model smollm2 · " in text_of(render(snapshot()))  # not read yet: nothing said
    hostile = render(snapshot(model_state="<b>x</b>"))
    assert "<b>x</b>" not in hostile
    assert bounded(snapshot(model_state="z" * 5000)).model_state == "z" * 256
