"""The chat request fields a shared server may get (pure): what passes, what is refused."""

import pytest

from brokerd.proxy.requestfields import CHAT_FIELDS, MAX_PROBS, field_refusal

LOOPD_REQUEST = {
    "model": "m",
    "id_slot": 0,
    "cache_prompt": True,
    "stream": True,
    "return_progress": True,
    "timings_per_token": True,
    "reasoning_control": True,
    "max_tokens": 100,
    "temperature": 0.6,
    "top_p": 0.95,
    "top_k": 20,
    "min_p": 0.0,
    "tools": [],
    "messages": [],
}


def test_loopds_own_request_passes() -> None:
    assert field_refusal(LOOPD_REQUEST) is None


@pytest.mark.parametrize(
    ("fields", "allowed"),
    [
        ({"n_cmpl": 1}, True),
        ({"n_cmpl": None}, True),  # the server reads null as absent
        ({"n_cmpl": 2}, False),
        ({"n_cmpl": 1.5}, False),
        ({"n_cmpl": True}, False),
        ({"n": 4}, False),
        ({"n_probs": MAX_PROBS}, True),
        ({"n_probs": MAX_PROBS + 1}, False),
        ({"n_probs": -1}, True),  # off, as 0 is
        ({"logprobs": True, "top_logprobs": 5}, True),
        ({"logprobs": 1000}, False),
        ({"top_logprobs": 1000}, False),
        ({"lora": []}, True),
        ({"lora": [{"id": 0, "scale": 1}]}, False),
        ({"backend_sampling": False}, True),
        ({"backend_sampling": True}, False),
        ({"samplers": "kpt", "dry_penalty_last_n": 10_000}, True),
        ({"best_of": 4}, False),  # not a field of this server: not examined, so refused
    ],
)
def test_each_rule(fields: dict[str, object], allowed: bool) -> None:
    assert (field_refusal({**LOOPD_REQUEST, **fields}) is None) == allowed


def test_a_refusal_names_the_field_and_the_bound() -> None:
    assert field_refusal({"n": 3}) == (
        "n",
        "it runs more completions at once, each on another slot than the one named (allowed: 1)",
    )
    name, why = field_refusal({"new_field": 1}) or ("", "")
    assert name == "new_field"
    assert "does not know" in why


def test_every_rule_says_why() -> None:
    assert all(rule.why for rule in CHAT_FIELDS.values())
