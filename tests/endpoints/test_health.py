"""Endpoint health: down on a dead failure or a failed check, re-checked later and later."""

import pytest

from loopd.endpoints.health import (
    EndpointHealth,
    endpoint_dead,
    needs_health_check,
)
from loopd.engine.outcome import Failure


@pytest.mark.parametrize(
    ("cause", "health", "dead"),
    [
        (Failure.UNREACHABLE, None, True),
        (Failure.SERVER_GONE, None, True),
        (Failure.TRUNCATED, False, True),  # cut, and /health no longer answers
        (Failure.TRUNCATED, True, False),  # cut, but the server is there
        (Failure.SILENCE, False, True),
        (Failure.FIRST_BYTE_TIMEOUT, None, False),  # queued: busy, not dead
        (Failure.REJECTED, None, False),
        (Failure.THINK_RUNAWAY, None, False),
        (None, None, False),
    ],
)
def test_dead_not_busy(cause: Failure | None, health: bool | None, dead: bool) -> None:
    assert endpoint_dead(cause, health) is dead


def test_only_a_cut_or_silent_stream_asks_health() -> None:
    asked = {cause for cause in Failure if needs_health_check(cause)}
    assert asked == {Failure.TRUNCATED, Failure.SILENCE}


def test_a_down_endpoint_is_rechecked_on_its_schedule_and_comes_back() -> None:
    health = EndpointHealth(["gpu1", "gpu2"])
    assert health.up() == ("gpu1", "gpu2")
    assert health.next_check() is None
    assert health.mark_down("gpu2", "unreachable", now=100.0)
    assert not health.mark_down("gpu2", "again", now=101.0)  # already down: no new schedule
    assert (health.up(), health.is_up("gpu2")) == (("gpu1",), False)
    assert health.due(101.9) == []
    assert health.due(102.0) == ["gpu2"]
    health.check_failed("gpu2", "still unreachable", now=102.0)
    down = health.down("gpu2")
    assert down is not None
    assert (down.reason, down.since, down.failed_checks, down.next_check) == (
        "still unreachable",
        100.0,
        2,
        106.0,
    )
    assert health.next_check() == 106.0
    assert health.mark_up("gpu2")
    assert not health.mark_up("gpu2")
    assert health.up() == ("gpu1", "gpu2")


def test_an_unknown_endpoint_is_not_up() -> None:
    assert not EndpointHealth(["gpu1"]).is_up("gpu9")
