"""The fleet: each session's endpoint from the log, and the load new sessions are placed by."""

from loopd.endpoints.fleet import ACTIVE_WINDOW_S, Fleet, parse_recorded_at
from loopd.endpoints.placement import Move, NowhereUp, Stay
from loopd.engine.cacheloss import LossCause


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_sessions_stay_where_the_log_says_their_cache_is() -> None:
    t = "2026-12-01T10:00:00.000000+00:00"
    clock = Clock(parse_recorded_at(t) + 60)
    fleet = Fleet(["gpu1", "gpu2"], placed={"a": ("gpu2", t), "b": ("gpu2", t)}, clock=clock)
    assert fleet.place("a") == Stay("gpu2")
    assert [(load.name, load.active_sessions) for load in fleet.loads()] == [
        ("gpu1", 0),
        ("gpu2", 2),
    ]
    # A new session goes where the load is less, and counts there at once.
    assert fleet.place("c") == Move("gpu1")
    assert fleet.place("d") == Move("gpu1")
    assert fleet.place("e") == Move("gpu1")  # gpu1 now has c and d: a tie goes to the first
    assert fleet.sessions_on("gpu1") == ["c", "d", "e"]


def test_waiting_turns_count_until_they_get_their_lane() -> None:
    fleet = Fleet(["gpu1", "gpu2"], clock=Clock(0.0))
    with fleet.waiting("gpu1"):
        assert fleet.place("a") == Move("gpu2")
    assert fleet.place("b") == Move("gpu1")


def test_a_quiet_session_stops_counting_but_keeps_its_endpoint() -> None:
    clock = Clock(1000.0)
    fleet = Fleet(["gpu1", "gpu2"], clock=clock)
    assert fleet.place("old") == Move("gpu1")
    clock.now += ACTIVE_WINDOW_S + 1
    assert [load.active_sessions for load in fleet.loads()] == [0, 0]
    assert fleet.place("new") == Move("gpu1")
    assert fleet.place("old") == Stay("gpu1")
    with fleet.running("old"):
        clock.now += ACTIVE_WINDOW_S + 1  # a long turn still counts while it runs
        assert [load.active_sessions for load in fleet.loads()] == [1, 0]
    assert [load.active_sessions for load in fleet.loads()] == [1, 0]  # ran just now


def test_a_lost_endpoints_sessions_move_and_come_back_only_as_new_ones() -> None:
    fleet = Fleet(["gpu1", "gpu2"], clock=Clock(0.0))
    assert fleet.place("a") == Move("gpu1")
    assert fleet.place("b") == Move("gpu2")
    fleet.health.mark_down("gpu1", "unreachable", now=0.0)
    moved = fleet.place("a")
    assert moved == Move("gpu2", lost="gpu1")
    assert isinstance(moved, Move)
    assert moved.cause is LossCause.ENDPOINT_LOST
    assert fleet.place("a") == Stay("gpu2")  # once moved, it stays: one re-read only
    assert fleet.place("c") == Move("gpu2")  # gpu1 is down
    fleet.health.mark_up("gpu1")
    assert fleet.place("a") == Stay("gpu2")
    assert fleet.place("d") == Move("gpu1")  # back: new sessions reach it again


def test_nothing_up_is_said() -> None:
    fleet = Fleet(["gpu1"], clock=Clock(0.0))
    fleet.health.mark_down("gpu1", "unreachable", now=0.0)
    assert fleet.place("a") == NowhereUp(("gpu1",))
    assert fleet.endpoint_of("a") is None


def test_an_unreadable_timestamp_is_long_ago() -> None:
    assert parse_recorded_at("yesterday") == 0.0
