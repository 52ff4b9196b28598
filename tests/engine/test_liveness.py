"""The liveness rules, every verdict, without a server."""

from __future__ import annotations

from typing import Any

import pytest

from loopd.engine.liveness import (
    FirstByteWait,
    Gone,
    Queued,
    SlotsFailed,
    SlotsHung,
    SlotsListed,
    SlotsNotAsked,
    SlotsRefused,
    Stuck,
    TimedOut,
    Unlisted,
    Waiting,
    health_verdict,
    no_first_byte,
    slot_busy,
    slots_verdict,
    worth_waiting_out,
)
from loopd.errors import ServerRejected, ServerUnreachable, StreamBroken

SLOTS: list[dict[str, Any]] = [
    {"id": 0, "is_processing": False},
    {"id": 1, "is_processing": True},
    {"is_processing": True},  # no id: belongs to no slot
]


def test_a_slot_is_busy_only_when_its_own_entry_says_processing() -> None:
    assert slot_busy(SLOTS, 1)
    assert not slot_busy(SLOTS, 0)
    assert not slot_busy(SLOTS, 2), "a slot /slots does not list is not busy"
    assert not slot_busy([], 0)


def test_listed_slots_mean_queued_or_waiting() -> None:
    assert slots_verdict(SLOTS, 1) == Queued()
    assert slots_verdict(SLOTS, 0) == Waiting()


def test_a_request_the_server_places_is_queued_only_while_every_slot_is_busy() -> None:
    assert slots_verdict(SLOTS, None) == Waiting(), "slot 0 is idle: the server takes it"
    every = [{"id": 0, "is_processing": True}, {"id": 1, "is_processing": True}]
    assert slots_verdict(every, None) == Queued()
    assert slots_verdict([], None) == Waiting(), "no slots listed says nothing"


@pytest.mark.parametrize(
    ("slots", "problem"),
    [
        (SlotsRefused(500), "answers 500"),
        (SlotsFailed("connection refused"), "fails (connection refused)"),
        (SlotsHung(5.0), "does not answer within 5 s"),
        (SlotsNotAsked(), "was refused before"),
    ],
)
def test_slots_and_health_both_failing_is_gone_naming_what_slots_did(
    slots: Unlisted, problem: str
) -> None:
    assert health_verdict(slots, health_answers=False) == Gone(
        f"/slots {problem} and /health does not answer"
    )


def test_slots_hanging_while_health_answers_is_stuck() -> None:
    assert health_verdict(SlotsHung(5.0), health_answers=True) == Stuck()


@pytest.mark.parametrize("slots", [SlotsRefused(503), SlotsFailed("reset"), SlotsNotAsked()])
def test_slots_failing_fast_while_health_answers_is_waiting(slots: Unlisted) -> None:
    assert health_verdict(slots, health_answers=True) == Waiting()


@pytest.mark.parametrize(
    ("status", "for_good"), [(400, True), (404, True), (501, True), (500, False), (503, False)]
)
def test_a_slots_refusal_is_for_good_only_for_a_4xx_or_501(status: int, for_good: bool) -> None:
    assert SlotsRefused(status).for_good is for_good


def test_only_a_503_before_the_first_byte_is_waited_out() -> None:
    url = "http://x"
    assert worth_waiting_out(ServerRejected(url, 503, "Loading model"))
    assert not worth_waiting_out(ServerRejected(url, 500, "boom"))
    assert not worth_waiting_out(ServerRejected(url, 400, "context exceeded"))
    assert not worth_waiting_out(ServerUnreachable(url, "refused"))
    assert not worth_waiting_out(StreamBroken("closed"))


def test_the_queue_wait_adds_up_the_stretches_the_slot_was_seen_busy() -> None:
    wait = FirstByteWait()
    wait = wait.polled(SlotsListed(SLOTS), Queued(), now=10.0)
    wait = wait.polled(SlotsListed(SLOTS), Queued(), now=12.0)
    assert wait.busy_since == 10.0, "a stretch begins at the first busy poll"
    wait = wait.polled(SlotsListed(SLOTS), Waiting(), now=15.0)
    assert (wait.busy_since, wait.queued_s) == (None, 5.0)
    wait = wait.polled(SlotsListed(SLOTS), Queued(), now=20.0)
    wait = wait.ended(now=23.0)
    assert (wait.busy_since, wait.queued_s) == (None, 8.0)
    assert wait.ended(now=30.0) == wait, "ending twice adds nothing"


def test_stuck_and_a_refusal_for_good_are_remembered() -> None:
    wait = FirstByteWait().polled(SlotsHung(5.0), Stuck(), now=1.0)
    wait = wait.polled(SlotsListed(SLOTS), Waiting(), now=2.0)
    assert wait.stuck
    assert not wait.polled(SlotsRefused(503), Waiting(), now=3.0).slots_refused
    refused = wait.polled(SlotsRefused(501), Waiting(), now=3.0)
    assert refused.slots_refused
    assert refused.polled(SlotsNotAsked(), Waiting(), now=4.0).slots_refused


def test_gone_is_remembered_and_ends_the_wait_as_gone() -> None:
    wait = FirstByteWait().polled(SlotsListed(SLOTS), Queued(), now=1.0)
    gone = wait.polled(SlotsFailed("refused"), Gone("it died"), now=4.0)
    assert gone.gone == "it died"
    assert gone.busy_since == 1.0, "a gone server closes no queue stretch by itself"
    assert no_first_byte(gone, timed_out=True) == Gone("it died")
    assert no_first_byte(gone, timed_out=False) == Gone("it died")


def test_no_first_byte_without_a_timeout_or_a_gone_server_is_no_failure() -> None:
    assert no_first_byte(FirstByteWait(), timed_out=False) is None


def test_a_timeout_says_how_long_the_slot_was_busy_and_whether_it_looked_stuck() -> None:
    assert no_first_byte(FirstByteWait(), timed_out=True) == TimedOut("the slot was not seen busy")
    queued = FirstByteWait(queued_s=8.4)
    assert no_first_byte(queued, timed_out=True) == TimedOut("queued 8 s behind another task")
    stuck = FirstByteWait(stuck=True)
    assert no_first_byte(stuck, timed_out=True) == TimedOut(
        "the slot was not seen busy; the server looks stuck: /slots did not answer while "
        "/health did"
    )
