"""Router mode routing and errors, and the small endpoints."""

from typing import Any

import httpx
import pytest

from loopd_dev.fakes.llama import FakeLlama, ModelSpec
from tests.fakes.llama.llama_fake_testkit import MODEL, chat_body, serving, user

pytestmark = pytest.mark.anyio

MISSING = "model name is missing from the request"


def _error(reply: httpx.Response) -> dict[str, Any]:
    error: dict[str, Any] = reply.json()["error"]
    return error


async def test_router_400s_for_missing_and_unknown_models() -> None:
    async with serving(FakeLlama()) as (_, client):
        no_model = await client.post("/v1/chat/completions", json={"messages": [user("x")]})
        unknown = await client.post(
            "/v1/chat/completions", json={"model": "nope", "messages": [user("x")]}
        )
        slots = await client.get("/slots")
        slots_unknown = await client.get("/slots", params={"model": "nope"})
        tokenize = await client.post("/tokenize", json={"content": "hi"})
    for reply in (no_model, unknown, slots, slots_unknown, tokenize):
        assert reply.status_code == 400
        assert _error(reply)["type"] == "invalid_request_error"
    assert _error(no_model)["message"] == MISSING
    assert _error(unknown)["message"] == "model 'nope' not found"
    assert _error(slots)["message"] == MISSING


async def test_autoload_false_refuses_an_unloaded_model() -> None:
    fake = FakeLlama([ModelSpec(MODEL), ModelSpec("cold", loaded=False)])
    async with serving(fake) as (_, client):
        refused = await client.get("/slots", params={"model": "cold", "autoload": "false"})
        listing = (await client.get("/v1/models")).json()
        loaded = await client.get("/slots", params={"model": "cold"})
        after = (await client.get("/models")).json()
    assert _error(refused)["message"] == "model is not loaded"
    assert {m["id"]: m["status"]["value"] for m in listing["data"]} == {
        MODEL: "loaded",
        "cold": "unloaded",
    }
    assert loaded.status_code == 200
    assert after["data"][1]["status"]["value"] == "loaded"
    assert after["object"] == "list"
    assert after["data"][0]["owned_by"] == "llamacpp"


async def test_props_router_stub_and_model_props() -> None:
    async with serving(FakeLlama([ModelSpec(MODEL, n_slots=3, n_ctx=2048)])) as (_, client):
        stub = (await client.get("/props")).json()
        props = (await client.get("/props", params={"model": MODEL})).json()
    assert stub["role"] == "router"
    assert stub["default_generation_settings"]["n_ctx"] == 0
    assert props["default_generation_settings"]["n_ctx"] == 2048
    assert props["total_slots"] == 3
    assert props["chat_template"]
    assert props["build_info"].startswith("b11434-")
    assert props["chat_template_caps"]["supports_tool_calls"] is True
    assert "role" not in props


async def test_template_hash_changes_with_the_reasoning_switch() -> None:
    from loopd_dev.fakes.llama import TemplateOptions

    templates = []
    for drop in (False, True):
        spec = ModelSpec(MODEL, template=TemplateOptions(drop_past_reasoning=drop))
        async with serving(FakeLlama([spec])) as (_, client):
            props = (await client.get("/props", params={"model": MODEL})).json()
        templates.append(props["chat_template"])
    assert templates[0] != templates[1]


async def test_health_404_apply_template_and_tokenize() -> None:
    async with serving(FakeLlama()) as (_, client):
        health = await client.get("/health")
        missing = await client.get("/nope")
        wrong_method = await client.get("/v1/chat/completions")
        template = await client.post(
            "/apply-template", json=chat_body({"role": "system", "content": "S"}, user("hi"))
        )
        pieces = await client.post(
            "/tokenize", json={"model": MODEL, "content": "Hi there", "with_pieces": True}
        )
        ids = await client.post("/tokenize", json={"model": MODEL, "content": "Hi there"})
    assert health.json() == {"status": "ok"}
    for reply in (missing, wrong_method):
        assert reply.status_code == 404
        assert reply.json() == {
            "error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}
        }
    assert template.json()["prompt"] == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert [p["piece"] for p in pieces.json()["tokens"]] == ["Hi", " there"]
    assert ids.json()["tokens"] == [p["id"] for p in pieces.json()["tokens"]]


@pytest.mark.parametrize(
    ("message", "status", "fragment"),
    [
        ({"role": "assistant", "content": "x", "reasoning_content": None}, 500, "Failed to parse"),
        ({"content": "x"}, 500, "Missing 'role'"),
        ({"role": "user"}, 400, "'content'"),
    ],
)
async def test_bad_messages_get_the_real_status(
    message: dict[str, Any], status: int, fragment: str
) -> None:
    async with serving(FakeLlama()) as (_, client):
        reply = await client.post(
            "/v1/chat/completions", json=chat_body(user("hi"), message, user("x"), stream=True)
        )
    assert reply.status_code == status
    assert reply.headers["content-type"].startswith("application/json")
    assert fragment in _error(reply)["message"]


async def test_missing_messages_and_bad_json() -> None:
    async with serving(FakeLlama()) as (_, client):
        missing = await client.post("/v1/chat/completions", json={"model": MODEL})
        broken = await client.post("/v1/chat/completions", content=b"{")
    assert _error(missing)["message"] == "'messages' is required"
    assert broken.status_code == 400
