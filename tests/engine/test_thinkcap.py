"""The thinking cap, every decision, without a server."""

from __future__ import annotations

from loopd.engine.thinkcap import (
    SUCCESS,
    CapDecision,
    Close,
    Continue,
    SendControl,
    ThinkCap,
    control_answer,
)

CAP = ThinkCap(cap=100, grace=20)


def test_below_the_cap_reading_goes_on() -> None:
    assert CAP.decide(0, answering=False, control_answer=None) == Continue()
    assert CAP.decide(99, answering=False, control_answer=None) == Continue()


def test_at_the_cap_the_control_call_is_sent() -> None:
    assert CAP.decide(100, answering=False, control_answer=None) == SendControl()
    assert CAP.decide(500, answering=False, control_answer=None) == SendControl()


def test_once_the_answer_began_thinking_is_over_whatever_the_count() -> None:
    assert CAP.decide(500, answering=True, control_answer=None) == Continue()
    assert CAP.decide(500, answering=True, control_answer="no such task") == Continue()


def test_after_the_control_call_thinking_has_a_grace() -> None:
    for answer in (SUCCESS, "task not found"):
        assert CAP.decide(100, answering=False, control_answer=answer) == Continue()
        assert CAP.decide(119, answering=False, control_answer=answer) == Continue()


def test_past_the_grace_a_stream_still_thinking_is_closed_saying_why() -> None:
    assert CAP.decide(120, answering=False, control_answer=SUCCESS) == Close(
        "the server accepted the control call but thinking went on"
    )
    assert CAP.decide(120, answering=False, control_answer="task not found") == Close(
        "the server could not end it (task not found)"
    )


def test_a_stream_thinking_on_gets_one_control_call_then_is_closed() -> None:
    answer: str | None = None
    decisions: list[CapDecision] = []
    for tokens in range(90, 130, 5):
        decision = CAP.decide(tokens, answering=False, control_answer=answer)
        decisions.append(decision)
        if isinstance(decision, SendControl):
            answer = SUCCESS
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
