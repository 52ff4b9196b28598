"""Helpers for the fake llama-server tests: serve a fake, read SSE, build requests."""

import json
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx

from loopd_dev.fakes.llama import FakeLlama, RunningFake, serve_fake_llama

MODEL = "fake-model"


@asynccontextmanager
async def serving(
    fake: FakeLlama, transport: str = "uds"
) -> AsyncIterator[tuple[RunningFake, httpx.AsyncClient]]:
    """Serve ``fake`` over a Unix socket ("uds") or loopback TCP ("tcp") with a client for it."""
    with tempfile.TemporaryDirectory(prefix="lf") as tmp:
        uds = Path(tmp) / "llama.sock" if transport == "uds" else None
        async with serve_fake_llama(fake, uds=uds) as running, running.client(timeout=10) as client:
            yield running, client


def chat_body(*messages: dict[str, Any], **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": MODEL, "messages": list(messages)}
    body.update(extra)
    return body


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def parse_events(raw: bytes) -> list[Any]:
    """The JSON of every ``data:`` event (``[DONE]`` as the string), in order."""
    events: list[Any] = []
    for block in raw.decode().split("\n\n"):
        if block.startswith("data: "):
            payload = block[len("data: ") :]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


async def stream_raw(client: httpx.AsyncClient, body: dict[str, Any]) -> bytes:
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        return await response.aread()


def assistant_from_events(events: list[Any]) -> dict[str, Any]:
    """The assistant message a client assembles from streamed deltas, for exact replay."""
    reasoning, content = "", ""
    calls: dict[int, dict[str, Any]] = {}
    for event in events:
        if event == "[DONE]" or not event["choices"]:
            continue
        delta = event["choices"][0]["delta"]
        reasoning += delta.get("reasoning_content") or ""
        content += delta.get("content") or ""
        for call in delta.get("tool_calls", []):
            entry = calls.setdefault(
                call["index"],
                {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
            )
            entry["id"] = call.get("id", entry["id"])
            entry["function"]["name"] = call.get("function", {}).get(
                "name", entry["function"]["name"]
            )
            entry["function"]["arguments"] += call.get("function", {}).get("arguments", "")
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message


async def eventually(check: Callable[[], Awaitable[bool]], seconds: float = 2) -> None:
    """Poll ``check`` (remote state, e.g. ``/slots``) until it holds; fail after ``seconds``."""
    with anyio.fail_after(seconds):
        while True:
            if await check():
                return
            await anyio.sleep(0.01)
