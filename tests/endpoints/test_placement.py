"""Placement across endpoints: new sessions spread, placed sessions stay, lost ones move."""

import pytest

from loopd.endpoints.placement import (
    EndpointLoad,
    Move,
    NowhereUp,
    Stay,
    choose_endpoint,
    place_turn,
)
from loopd.engine.cacheloss import LossCause


def load(
    name: str, up: bool = True, waiting: int = 0, active: int = 0, shared: int | None = None
) -> EndpointLoad:
    return EndpointLoad(name, up, waiting, active, shared)


@pytest.mark.parametrize(
    ("loads", "chosen"),
    [
        ([load("a"), load("b")], "a"),  # a tie, nothing known: the first configured
        ([load("a", active=1), load("b")], "b"),
        ([load("a", waiting=2), load("b", active=1)], "b"),  # waiting turns and sessions add up
        ([load("a", waiting=1), load("b", active=1)], "a"),
        ([load("a", shared=0), load("b", shared=812)], "b"),  # a tie: more of the prefix held
        ([load("a", active=1, shared=0), load("b", active=2, shared=812)], "a"),  # load first
        ([load("a", up=False), load("b", active=5)], "b"),  # a down endpoint gets nobody
        ([load("a", up=False), load("b", up=False)], None),
    ],
)
def test_a_new_session_goes_to_the_least_loaded_endpoint_up(
    loads: list[EndpointLoad], chosen: str | None
) -> None:
    assert choose_endpoint(loads) == chosen


def test_new_sessions_spread_when_each_counts_where_it_went() -> None:
    active = {"a": 0, "b": 0}
    placed = []
    for _ in range(5):
        name = choose_endpoint([load(n, active=count) for n, count in active.items()])
        assert name is not None
        active[name] += 1
        placed.append(name)
    assert placed == ["a", "b", "a", "b", "a"]


def test_a_placed_session_stays_on_its_endpoint_however_loaded_while_it_is_up() -> None:
    assert place_turn("a", [load("a", waiting=9, active=9), load("b")]) == Stay("a")


def test_a_session_whose_endpoint_is_down_moves_and_says_why() -> None:
    placement = place_turn("a", [load("a", up=False), load("b", active=3), load("c", active=1)])
    assert placement == Move("c", lost="a")
    assert isinstance(placement, Move)
    assert placement.cause is LossCause.ENDPOINT_LOST


def test_a_session_whose_endpoint_left_the_configuration_moves_too() -> None:
    placement = place_turn("old", [load("a"), load("b")])
    assert placement == Move("a", lost="old")


def test_a_first_placement_has_no_cause() -> None:
    placement = place_turn(None, [load("a", active=1), load("b")])
    assert placement == Move("b")
    assert isinstance(placement, Move)
    assert placement.cause is None


def test_nowhere_up_names_the_endpoints() -> None:
    assert place_turn("a", [load("a", up=False), load("b", up=False)]) == NowhereUp(("a", "b"))
