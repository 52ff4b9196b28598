"""What loopd does with what a server sends, and brokerd with what the box sends, each run in a
child process by ``tests.watch`` (so that its peak memory and its event loop's longest stall are
the scenario's alone). Each takes the server's address and returns JSON."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import httpx

from brokerd.observe.relay import LoopdRelay, RelayError
from brokerd.proxy.inference import InferencePolicy, create_inference_app
from brokerd.proxy.slotfolder import SlotFolder
from brokerd.proxy.upstream import parse_upstream
from loopd.chat.rest import MattermostClient, MattermostError, api_client
from loopd.chat.ws import SocketLost, open_socket
from loopd.engine.client import InferenceClient
from loopd.engine.limits import Limits
from loopd.engine.stream import run_request
from loopd.errors import InferenceError

CHAT_BODY = b'{"model": "m", "stream": true, "messages": []}'


async def one_request(url: str, silence_s: str = "60") -> dict[str, Any]:
    """One streamed chat request, read as a turn reads it: how it ended (``error``: the failure
    and its line)."""
    async with InferenceClient(url, "m") as client:
        limits = Limits(silence_s=float(silence_s), attempts=1)
        result = await run_request(client, CHAT_BODY, slot=0, limits=limits)
    failure = None if result.failure is None else result.failure.value
    return {
        "failure": failure,
        "detail": result.detail,
        "error": None if failure is None else f"{failure}: {result.detail}",
        "content": result.assembler.content,
        "ended_s": result.ended_s,
    }


async def slots_call(url: str) -> dict[str, Any]:
    """``GET /slots``, as the first-byte watch polls it."""
    async with InferenceClient(url, "m") as client:
        try:
            return {"slots": len(await client.slots()), "error": None}
        except InferenceError as exc:
            return {"slots": None, "error": str(exc)}


async def mattermost_call(url: str) -> dict[str, Any]:
    """``GET /users/me`` through loopd's Mattermost client (one attempt)."""
    client = MattermostClient(api_client(url, None), retry_for_s=0)
    try:
        await client.call("GET", "/users/me", "GET /users/me", retry_for_s=0)
    except MattermostError as exc:
        return {"error": str(exc)}
    finally:
        await client.aclose()
    return {"error": None}


async def status_page(socket_path: str) -> dict[str, Any]:
    """brokerd's status page, relayed from loopd's socket at ``socket_path``: two asked at once,
    as the page's refresh and a second browser do."""
    relay = LoopdRelay(Path(socket_path))
    outcomes: list[str] = []

    async def one() -> None:
        try:
            page = await relay.fetch("/loopd/")
        except RelayError as exc:
            outcomes.append(str(exc))
        else:
            outcomes.append(f"a page of {len(page.body):,} bytes")

    async with anyio.create_task_group() as tg:
        for _ in range(2):
            tg.start_soon(one)
    return {"outcomes": outcomes}


async def box_saves(llama_socket: str, folder: str, cap: str, *names: str) -> dict[str, Any]:
    """brokerd's inference proxy for a box allowed slot 0, in front of the server on
    ``llama_socket`` whose save folder is ``folder`` (capped at ``cap`` bytes): a save of each
    of ``names``, in order, as loopd asks for them. The statuses."""
    slot_folder = SlotFolder((Path(folder),), int(cap), client="this box")
    app = create_inference_app(
        parse_upstream(f"unix:{llama_socket}"),
        policy=InferencePolicy(frozenset({0}), frozenset({"smollm2"})),
        slot_folder=slot_folder,
    )
    statuses = []
    transport = httpx.ASGITransport(app)
    async with httpx.AsyncClient(transport=transport, base_url="http://infer") as box:
        for name in names:
            body = {"filename": name, "model": "smollm2"}
            answer = await box.post("/slots/0", params={"action": "save"}, json=body)
            statuses.append(answer.status_code)
    return {"statuses": statuses}


async def mattermost_socket(url: str) -> dict[str, Any]:
    """loopd's Mattermost WebSocket at ``url``, its events read until it is lost."""
    events = 0
    try:
        async with open_socket(url, None, None) as socket:
            async for _ in socket.events():
                events += 1
    except SocketLost as exc:
        return {"events": events, "error": str(exc)}
    return {"events": events, "error": None}
