"""The quiet rule (``loopd.engine.quiet``): which requests may go when nobody waits. Pure; the
real router's side of each fact is ``tests/durable/test_quiet_real.py``."""

from __future__ import annotations

import pytest

from loopd.engine.modelstate import ModelStatus
from loopd.engine.quiet import ANSWERED_ASLEEP, Call, Purpose, may_send, router_params

WAKING = [call for call in Call if call not in ANSWERED_ASLEEP]


@pytest.mark.parametrize("call", list(Call))
@pytest.mark.parametrize("model", list(ModelStatus))
def test_a_person_may_send_anything_and_load_the_model(call: Call, model: ModelStatus) -> None:
    verdict = may_send(call, Purpose.PERSON, model)
    assert verdict.allowed
    assert verdict.autoload


@pytest.mark.parametrize("purpose", [Purpose.CHECK, Purpose.WORK])
@pytest.mark.parametrize("call", sorted(ANSWERED_ASLEEP))
@pytest.mark.parametrize("model", list(ModelStatus))
def test_nobody_waiting_may_ask_what_a_sleeping_model_answers_asleep(
    purpose: Purpose, call: Call, model: ModelStatus
) -> None:
    verdict = may_send(call, purpose, model)
    assert verdict.allowed
    assert not verdict.autoload


@pytest.mark.parametrize("call", WAKING)
@pytest.mark.parametrize("model", list(ModelStatus))
def test_a_background_check_never_sends_what_wakes(call: Call, model: ModelStatus) -> None:
    verdict = may_send(call, Purpose.CHECK, model)
    assert not verdict.allowed
    assert verdict.why == f"a background check never sends {call.value}: it wakes"


@pytest.mark.parametrize("call", WAKING)
def test_background_work_runs_only_on_a_model_awake_now(call: Call) -> None:
    assert may_send(call, Purpose.WORK, ModelStatus.AWAKE) == may_send(
        Call.HEALTH, Purpose.WORK, ModelStatus.AWAKE
    )
    for model in set(ModelStatus) - {ModelStatus.AWAKE}:
        verdict = may_send(call, Purpose.WORK, model)
        assert not verdict.allowed
        assert verdict.why == f"the model is {model.value}: background work waits for a person"


def test_only_a_person_lets_the_router_load_the_model() -> None:
    assert router_params(Purpose.PERSON) == {}
    assert router_params(Purpose.CHECK) == {"autoload": "false"}
    assert router_params(Purpose.WORK) == {"autoload": "false"}
