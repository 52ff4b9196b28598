"""The thinking cap, every decision, without a server."""

from __future__ import annotations

from loopd.engine.thinkcap import (
    SUCCESS,
    CapDecision,
    Close,
    Continue,
    ControlCall,
    SendControl,
    ThinkCap,
    control_answer,
)

CAP = ThinkCap(cap=100, grace=20)
IN_FLIGHT = ControlCall()


def answered(answer: str, at: int = 100) -> ControlCall:
    return ControlCall(answer, answered_at=at)


def test_below_the_cap_reading_goes_on() -> None:
    assert CAP.decide(0, answering=False, control=None) == Continue()
    assert CAP.decide(99, answering=False, control=None) == Continue()


def test_at_the_cap_the_control_call_is_sent() -> None:
    assert CAP.decide(100, answering=False, control=None) == SendControl()
    assert CAP.decide(500, answering=False, control=None) == SendControl()


def test_a_looping_thought_gets_the_control_call_before_the_cap() -> None:
    assert CAP.decide(10, answering=False, control=None, looping=True) == SendControl()
    assert CAP.decide(10, answering=False, control=IN_FLIGHT, looping=True) == Continue()


def test_once_the_answer_began_thinking_is_over_whatever_the_count() -> None:
    assert CAP.decide(500, answering=True, control=None) == Continue()
    assert CAP.decide(500, answering=True, control=answered("no such task")) == Continue()


def test_after_the_control_call_thinking_has_a_grace() -> None:
    for answer in (SUCCESS, "task not found"):
        assert CAP.decide(100, answering=False, control=answered(answer)) == Continue()
        assert CAP.decide(119, answering=False, control=answered(answer)) == Continue()


def test_past_the_grace_a_stream_still_thinking_is_closed_saying_why() -> None:
    assert CAP.decide(120, answering=False, control=answered(SUCCESS)) == Close(
        "the server accepted the control call but thinking went on"
    )
    assert CAP.decide(120, answering=False, control=answered("task not found")) == Close(
        "the server could not end it (task not found)"
    )


def test_while_the_control_call_is_in_flight_reading_goes_on_however_long() -> None:
    """On a loaded machine the call's round trip is long and the server writes on meanwhile:
    those tokens were written before the call reached it, not past its grace."""
    assert CAP.decide(100_000, answering=False, control=IN_FLIGHT) == Continue()


def test_the_grace_counts_from_where_the_answer_arrived_when_that_is_past_the_cap() -> None:
    late = answered(SUCCESS, at=700)
    assert CAP.decide(719, answering=False, control=late) == Continue()
    assert CAP.decide(720, answering=False, control=late) == Close(
        "the server accepted the control call but thinking went on"
    )


def test_a_looping_thought_the_server_cannot_end_runs_to_the_cap_and_its_grace() -> None:
    early = answered("reasoning control not enabled", at=10)
    assert CAP.decide(119, answering=False, control=early) == Continue()
    assert CAP.decide(120, answering=False, control=early) == Close(
        "the server could not end it (reasoning control not enabled)"
    )


def test_a_stream_thinking_on_gets_one_control_call_then_is_closed() -> None:
    control: ControlCall | None = None
    decisions: list[CapDecision] = []
    for tokens in range(90, 130, 5):
        decision = CAP.decide(tokens, answering=False, control=control)
        decisions.append(decision)
        if isinstance(decision, SendControl):
            control = answered(SUCCESS, at=tokens)
    assert decisions.count(SendControl()) == 1
    assert decisions[2] == SendControl(), "at 100 tokens"
    assert (
        decisions[-2:] == [Close("the server accepted the control call but thinking went on")] * 2
    )


def test_the_control_answer_in_a_word() -> None:
    assert control_answer({"success": True}) == SUCCESS
    assert control_answer({"success": False, "message": "task not found"}) == "task not found"
    assert control_answer({"success": False}) == "success: false"
    assert control_answer({}) == "success: false"
    assert control_answer({"success": "true"}) == "success: false", "only a JSON true arms it"
