"""Request building: fixed fields, the epoch's tools bytes, the stored messages concatenated."""

import json

from hypothesis import given
from hypothesis import strategies as st

from loopcommon.jsonbytes import dumps
from loopd.engine.request import RequestSettings, Sampling, build_body

SETTINGS = RequestSettings(model="m", slot=1, max_tokens=128)


def test_body_carries_every_required_field() -> None:
    body = json.loads(build_body(SETTINGS, "[]", [dumps({"role": "user", "content": "hi"})]))
    assert body["model"] == "m"
    assert body["id_slot"] == 1
    assert body["cache_prompt"] is True
    assert body["stream"] is True
    assert body["return_progress"] is True
    assert body["timings_per_token"] is True
    assert body["reasoning_control"] is True
    assert body["max_tokens"] == 128
    assert (body["temperature"], body["top_p"], body["top_k"], body["min_p"]) == (
        0.6,
        0.95,
        20,
        0.0,
    )
    assert "tools" not in body  # an empty tools array is left out


def test_tools_and_messages_are_the_stored_bytes() -> None:
    tools = '[{"type":"function","function":{"name":"x","parameters":{ "b":1,"a":2}}}]'
    stored = ['{"role":"user","content":"é  \\u00e9"}', '{"role":"assistant","content":"ok"}']
    body = build_body(SETTINGS, tools, stored).decode()
    assert f'"tools":{tools}' in body
    assert body.endswith('"messages":[' + ",".join(stored) + "]}")


@given(st.lists(st.text(), min_size=1, max_size=6), st.text())
def test_request_k_plus_1_extends_request_k(texts: list[str], answer: str) -> None:
    stored = [dumps({"role": "user", "content": t}) for t in texts]
    first = build_body(SETTINGS, "[]", stored).decode()
    nxt = build_body(SETTINGS, "[]", [*stored, dumps({"role": "assistant", "content": answer})])
    prefix = first[: -len("]}")]
    assert nxt.decode().startswith(prefix)
    assert json.loads(nxt)["messages"][: len(texts)] == json.loads(first)["messages"]


def test_sampling_is_configurable() -> None:
    settings = RequestSettings("m", 0, 10, Sampling(temperature=0.0, top_p=1.0, top_k=1, min_p=0.1))
    body = json.loads(build_body(settings, "", []))
    assert (body["temperature"], body["top_k"], body["min_p"]) == (0.0, 1, 0.1)
