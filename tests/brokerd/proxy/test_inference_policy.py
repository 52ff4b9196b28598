"""Which slots and models a request may use (pure)."""

import json

import pytest

from brokerd.proxy.inference import InferencePolicy, body_refusal, query_refusal

POLICY = InferencePolicy(slots=frozenset({0, 2}), models=frozenset({"smollm2"}))
CHAT = ("POST", "/v1/chat/completions")


def status(policy: InferencePolicy, route: tuple[str, str], body: object) -> int:
    refused = body_refusal(policy, *route, json.dumps(body).encode())
    return 200 if refused is None else refused.status


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"model": "smollm2", "id_slot": 2}, 200),
        ({"model": "smollm2", "id_slot": 1}, 403),
        ({"model": "smollm2", "id_slot": -1}, 403),
        ({"model": "smollm2"}, 403),
        ({"model": "smollm2", "id_slot": "0"}, 403),  # llama-server would read it as -1
        ({"model": "smollm2", "id_slot": 0.0}, 403),
        ({"model": "other", "id_slot": 0}, 403),
        ({"id_slot": 0}, 403),
        ([1, 2], 400),
    ],
)
def test_a_chat_request_names_an_allowed_slot_and_model(body: object, expected: int) -> None:
    assert status(POLICY, CHAT, body) == expected


def test_routes_without_a_slot_check_only_the_model() -> None:
    for route in (("POST", "/apply-template"), ("POST", "/tokenize")):
        assert status(POLICY, route, {"model": "smollm2", "id_slot": 7}) == 200
        assert status(POLICY, route, {"model": "other"}) == 403
    assert status(POLICY, ("GET", "/slots"), None) == 200


def test_empty_lists_allow_any_slot_and_model_but_not_broken_bodies() -> None:
    assert status(InferencePolicy(), CHAT, {"model": "x", "id_slot": -1}) == 200
    deep = body_refusal(InferencePolicy(), *CHAT, b"[" * 100_000 + b"]" * 100_000)
    assert deep is not None
    assert deep.status == 400
    nested: object = {"messages": [{"content": [[[[[[[[[[]]]]]]]]]]}]}
    assert status(InferencePolicy(), CHAT, nested) == 200


def test_a_model_in_the_query_must_be_allowed() -> None:
    assert query_refusal(POLICY, b"model=smollm2") is None
    assert query_refusal(POLICY, b"x=1&model=big%2Dmodel") == (
        "brokerd refuses model 'big-model': allowed smollm2"
    )
    assert query_refusal(InferencePolicy(), b"model=anything") is None


def test_one_endpoints_refusal_names_it() -> None:
    gpu1 = InferencePolicy(slots=frozenset({0}), models=frozenset({"small"}), endpoint="gpu1")
    refused = body_refusal(gpu1, *CHAT, json.dumps({"model": "large", "id_slot": 0}).encode())
    assert refused is not None
    assert refused.message == "brokerd refuses model 'large' on endpoint gpu1: allowed small"
    refused = body_refusal(gpu1, *CHAT, json.dumps({"model": "small", "id_slot": 1}).encode())
    assert refused is not None
    assert refused.message == "brokerd refuses id_slot 1 on endpoint gpu1: a request must name 0"
