"""The probe's handling of the server's answers, with HTTP faked by respx."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import respx

from loopd.engine.client import CONTROL_PATH, InferenceClient
from loopd.engine.request import Sampling
from loopd.errors import ServerRejected
from loopd.selftest import template
from loopd.selftest.probe import (
    STREAM_PROBE_GROWTH,
    ProbeConfig,
    probe_props,
    probe_render,
    probe_stream,
    probe_template,
)
from loopd.selftest.template import REASONING_MARKER, TemplateAnswer
from loopd.sessionlog import (
    RequestKind,
    RequestRecord,
    SessionLog,
    fresh_external_key,
    messages_digest,
)

pytestmark = pytest.mark.anyio

URL = "http://llama.test:8080"
TEMPLATE = "{{ messages }}"
PROPS: dict[str, Any] = {
    "default_generation_settings": {"params": {}, "n_ctx": 4096},
    "total_slots": 2,
    "chat_template": TEMPLATE,
    "build_info": "b11434-pypi-sdist",
}


@respx.mock
async def test_a_dropped_pooled_connection_is_retried() -> None:
    route = respx.get(f"{URL}/props").mock(
        side_effect=[
            httpx.RemoteProtocolError("Server disconnected without sending a response."),
            httpx.Response(200, json=PROPS),
        ]
    )
    async with InferenceClient(URL, "m") as client:
        props = await probe_props(client, 5.0)
    assert props.n_ctx_per_slot == 4096
    assert route.call_count == 2


@respx.mock
async def test_a_server_error_is_not_retried() -> None:
    route = respx.get(f"{URL}/props").mock(return_value=httpx.Response(500, json={"error": {}}))
    async with InferenceClient(URL, "m") as client:
        with pytest.raises(ServerRejected):
            await probe_props(client, 5.0)
    assert route.call_count == 1


def config() -> ProbeConfig:
    return ProbeConfig(
        harness_slots=(1,),
        sampling=Sampling(),
        max_tokens=64,
        system_text="sys",
        tools_text='[{"type":"function","function":{"name":"look","parameters":{}}}]',
        first_byte_s=5.0,
        silence_s=5.0,
        small_call_s=5.0,
    )


@respx.mock
async def test_render_sends_loopds_exact_settings_and_reports_a_rejection() -> None:
    bodies: list[bytes] = []

    def answer(request: httpx.Request) -> httpx.Response:
        bodies.append(request.content)
        if json.loads(request.content)["messages"][-1]["role"] == "tool":
            return httpx.Response(500, json={"error": {"message": "Failed to parse messages"}})
        return httpx.Response(200, json={"prompt": "rendered"})

    respx.post(f"{URL}/apply-template").mock(side_effect=answer)
    async with InferenceClient(URL, "m") as client:
        probe = await probe_render(client, config())
    assert probe.rendered == 0
    assert probe.failure.startswith("tool round: llama-server at")
    assert "Failed to parse messages" in probe.failure
    first = json.loads(bodies[0])
    assert (first["model"], first["id_slot"], first["max_tokens"]) == ("m", 1, 64)
    assert first["stream"] is first["reasoning_control"] is first["cache_prompt"] is True
    assert [tool["function"]["name"] for tool in first["tools"]] == ["look"]
    assert [m["role"] for m in first["messages"]] == ["system", "user"]


@respx.mock
async def test_template_probe_judges_the_rendered_prompts() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        text = request.content.decode()
        # A template that keeps reasoning and renders a tool turn the same with a user after it.
        prompt = "".join(part for part in (REASONING_MARKER, "tool") if part in text)
        if '"Thanks."' in text:
            prompt += "+user"
        return httpx.Response(200, json={"prompt": prompt})

    respx.post(f"{URL}/apply-template").mock(side_effect=answer)
    async with InferenceClient(URL, "m") as client:
        probe = await probe_template(client, config())
    assert probe.keeps_past_reasoning is TemplateAnswer.YES
    assert probe.tool_turn_prefix is TemplateAnswer.YES


@respx.mock
async def test_template_probe_is_unknown_when_the_server_refuses() -> None:
    respx.post(f"{URL}/apply-template").mock(return_value=httpx.Response(400, json={}))
    async with InferenceClient(URL, "m") as client:
        probe = await probe_template(client, config())
    assert probe.keeps_past_reasoning is TemplateAnswer.UNKNOWN
    assert probe.tool_turn_prefix is TemplateAnswer.UNKNOWN
    assert "answered 400" in probe.detail


STREAMS = Path(__file__).resolve().parent.parent / "data" / "streams"


@respx.mock
async def test_an_answer_over_before_the_control_call_is_asked_again_for_a_longer_one() -> None:
    """A fast server (the tiny hybrid model writes 32 tokens in about 15 ms) finishes before
    the control call arrives; the probe then runs again with a longer answer."""
    recorded = (STREAMS / "plain.sse").read_bytes()
    sent: list[int] = []

    def chat(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content)["max_tokens"])
        return httpx.Response(200, content=recorded, headers={"content-type": "text/event-stream"})

    answers = iter(
        [{"success": False, "message": "no active completion for this id"}, {"success": True}]
    )
    respx.post(f"{URL}/v1/chat/completions").mock(side_effect=chat)
    respx.post(f"{URL}{CONTROL_PATH}").mock(
        side_effect=lambda request: httpx.Response(200, json=next(answers))
    )
    probe = await probe_stream(lambda: InferenceClient(URL, "m"), config())
    assert sent == [32, 32 * STREAM_PROBE_GROWTH]
    assert probe.control_answer == "success"
    assert probe.complete


def test_the_probe_conversations_are_what_the_session_log_replays(tmp_path: Path) -> None:
    """Built with the log's and the engine's own message builders, the tool round renders what a
    session that lived it sends: the log replays the same bytes."""
    log = SessionLog.open(tmp_path / "loopd.db")
    try:
        log.ensure_session("s", 0)
        log.start_epoch("s", reason="start", tools_text="[]", system_text="S")
        log.append_user("s", "Say OK.", external_key=fresh_external_key())
        probe = template.user_after_tool("S", "read_file")
        messages = log.replay_messages("s")
        record = RequestRecord(RequestKind.TURN, 0, 1, len(messages), messages_digest(messages))
        log.append_assistant("s", probe[2], request=record)
        log.append_tool_result(
            "s", tool_call_id=template.PROBE_CALL_ID, content="selftest tool result"
        )
        log.append_user("s", "Thanks.", external_key=fresh_external_key())
        assert log.replay_messages("s") == probe
    finally:
        log.close()
