"""The transports own their errors: whatever httpx raises inside the inference client or the broker
client comes out as loopd's own (``loopd.errors``), the original kept as the cause."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import httpx
import pytest
import respx

from loopd.engine.client import CONTROL_PATH, EventStream, InferenceClient
from loopd.engine.thinkcap import SUCCESS
from loopd.errors import (
    InferenceError,
    ServerRejected,
    ServerUnreachable,
    StreamBroken,
    StreamCut,
)
from loopd.tools.broker_client import BrokerClient, result_text
from loopd.wire.events import ChunkMeta, ContentDelta, Done, StreamEvent

pytestmark = pytest.mark.anyio

URL = "http://llama.test"
MODEL = "m"
CHUNK = (
    b'data: {"id":"c1","model":"m","choices":[{"index":0,"delta":{"content":"hi"},'
    b'"finish_reason":null}]}\n\n'
)


class _CutStream(httpx.AsyncByteStream):
    """A body that sends one chunk, then the connection breaks."""

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield CHUNK
        raise httpx.ReadError("connection reset by peer")


def _cut(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, stream=_CutStream())


async def test_a_non_json_answer_to_a_call_is_rejected_not_a_value_error() -> None:
    with respx.mock(base_url=URL) as mock:
        mock.post("/apply-template").respond(200, text="<html>a proxy page</html>")
        async with InferenceClient(URL, MODEL) as client:
            with pytest.raises(ServerRejected) as caught:
                await client.post_json("/apply-template", {}, 5)
    assert (caught.value.status, caught.value.message) == (200, "/apply-template answered non-JSON")
    assert isinstance(caught.value.__cause__, ValueError)


async def test_a_connection_broken_mid_stream_is_a_stream_cut_for_every_way_of_reading() -> None:
    with respx.mock(base_url=URL) as mock:
        mock.post("/v1/chat/completions").mock(side_effect=_cut)
        async with InferenceClient(URL, MODEL) as client:
            async with client.stream_chat(b"{}") as answer:
                assert await answer.receive() == CHUNK
                with pytest.raises(StreamCut) as caught:
                    await answer.receive()
            async with client.stream_chat(b"{}") as answer:
                with pytest.raises(StreamCut):
                    await answer.aread()
            async with client.stream_chat(b"{}") as answer:
                with pytest.raises(StreamCut):
                    async for _chunk in answer.aiter_raw():
                        pass
    assert (
        str(caught.value) == f"the connection to {URL} broke mid-stream: connection reset by peer"
    )
    assert isinstance(caught.value.__cause__, httpx.ReadError)


async def test_a_server_closing_before_the_status_line_is_a_broken_stream() -> None:
    def hang_up(request: httpx.Request) -> httpx.Response:
        raise httpx.RemoteProtocolError("Server disconnected without sending a response.")

    with respx.mock(base_url=URL) as mock:
        mock.post("/v1/chat/completions").mock(side_effect=hang_up)
        mock.get("/slots").mock(side_effect=hang_up)
        async with InferenceClient(URL, MODEL) as client:
            with pytest.raises(StreamBroken) as streamed:
                async with client.stream_chat(b"{}"):
                    pass
            with pytest.raises(ServerUnreachable) as polled:
                await client.slots()
    assert not isinstance(streamed.value, StreamCut)
    assert "closed the connection before answering" in str(streamed.value)
    # The self-test retries a small call whose pooled connection was dropped by its cause.
    assert isinstance(polled.value.__cause__, httpx.RemoteProtocolError)


async def test_nothing_listening_is_unreachable_for_calls_and_streams(tmp_path: Path) -> None:
    url = f"unix:{tmp_path / 'nobody.sock'}"
    async with InferenceClient(url, MODEL, connect_s=1.0) as client:
        with pytest.raises(ServerUnreachable):
            await client.health()
        with pytest.raises(ServerUnreachable):
            await client.slot_busy(0)
        with pytest.raises(ServerUnreachable):
            async with client.stream_chat(b"{}"):
                pass


async def test_an_answer_that_cannot_be_decoded_is_an_inference_error() -> None:
    def garbled(request: httpx.Request) -> httpx.Response:
        raise httpx.DecodingError("invalid gzip", request=request)

    with respx.mock(base_url=URL) as mock:
        mock.get("/props").mock(side_effect=garbled)
        async with InferenceClient(URL, MODEL) as client:
            with pytest.raises(InferenceError, match="could not be read: invalid gzip"):
                await client.props()


class _Chunks:
    def __init__(self, *chunks: bytes) -> None:
        self._chunks = list(chunks)

    async def receive(self) -> bytes:
        if not self._chunks:
            raise anyio.EndOfStream
        return self._chunks.pop(0)


async def test_the_event_stream_gives_each_chunks_events_then_the_rest_then_ends() -> None:
    events = EventStream(_Chunks(CHUNK[:30], CHUNK[30:] + b"data: [DONE]"))
    batches: list[list[StreamEvent]] = []
    while not events.at_end:
        batches.append(await events.receive())
    assert batches[0] == [], "half an event is held back"
    assert batches[1] == [ChunkMeta("c1", "m"), ContentDelta("hi")]
    assert batches[2] == [Done()], "the last line had no blank line after it"
    with pytest.raises(anyio.EndOfStream):
        await events.receive()


async def test_a_broker_that_breaks_its_answer_is_a_result_text() -> None:
    def reset(request: httpx.Request) -> httpx.Response:
        raise httpx.RemoteProtocolError("peer closed connection", request=request)

    transport = httpx.MockTransport(reset)
    async with BrokerClient("http://brokerd", transport=transport) as client:
        text = await client.call_tool("s", "call-1", "web_fetch", "{}")
    assert text == (
        "call_tool 'web_fetch': brokerd did not answer (RemoteProtocolError: peer closed "
        "connection). If this was a tool call it may or may not have taken effect."
    )


def test_a_broker_answer_that_is_not_json_is_named_with_its_status() -> None:
    assert result_text(200, b'{"result": "ok"}', "find_tool") == "ok"
    assert (
        result_text(502, b"<html>Bad Gateway</html>", "find_tool")
        == "find_tool: brokerd answered HTTP 502: <html>Bad Gateway</html>"
    )
    assert (
        result_text(200, b"\xff\xfe", "find_tool")
        == "find_tool: brokerd answered HTTP 200: \ufffd\ufffd"
    )
    assert (
        result_text(400, b'{"error": "bad request: session"}', "find_tool")
        == "find_tool: brokerd answered HTTP 400: bad request: session"
    )


@respx.mock
async def test_the_control_call_is_answered_in_a_word_and_never_raises() -> None:
    """``end_reasoning``: what the engine's cap and the self-test's probe both record."""
    control = respx.post(f"{URL}{CONTROL_PATH}")
    async with InferenceClient(URL, MODEL) as client:
        assert await client.end_reasoning(None) == "no completion id in the stream"
        control.mock(return_value=httpx.Response(200, json={"success": True}))
        assert await client.end_reasoning("c1") == SUCCESS
        control.mock(return_value=httpx.Response(200, json={"success": False, "message": "no"}))
        assert await client.end_reasoning("c1") == "no"
        control.mock(return_value=httpx.Response(404, json={"error": {"message": "gone"}}))
        answer = await client.end_reasoning("c1")
    assert answer.startswith("control call failed: "), answer
    assert "404" in answer, answer
    assert json.loads(control.calls[0].request.content) == {
        "id": "c1",
        "action": "reasoning_end",
        "model": MODEL,
    }
