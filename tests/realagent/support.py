"""A loopd runtime on the tool model, with a client that keeps every body it sent and every byte
it received, and readers of what the session log then holds.

Each turn is bounded by tokens: ``max_tokens`` 150 a request (the preset's setting) and the repeat
guard, which with ``repeat_limit`` 1 ends a turn at the model's first identical repeat, so a turn
whose model calls a tool is two requests (the call; the request that reads its result back and
repeats it), and a turn whose calls differ each round ends within ``MAX_ROUNDS`` requests.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loopd.config import SHORTHAND_ENDPOINT, load_settings
from loopd.endpoints.server import TurnRules
from loopd.engine.client import ChatStream, InferenceClient
from loopd.engine.outcome import TurnOutcome
from loopd.sessionlog.records import fresh_external_key
from loopd.sessions import Runtime
from loopd.turn.loop import DEFAULT_MAX_ROUNDS
from loopd.wire.assemble import ToolCall
from loopd.wire.events import EventDecoder, ToolCallDelta
from loopd_dev import devserver


class TappedClient(InferenceClient):
    """loopd's client, keeping each chat body it sends and each stream's bytes as received."""

    bodies: list[bytes]
    streams: list[bytearray]

    @asynccontextmanager
    async def stream_chat(self, body: bytes) -> AsyncIterator[ChatStream]:
        self.bodies.append(body)
        received = bytearray()
        self.streams.append(received)
        async with super().stream_chat(body) as stream:
            receive = stream.receive

            async def tapped() -> bytes:
                chunk = await receive()
                received.extend(chunk)
                return chunk

            stream.receive = tapped  # type: ignore[method-assign]
            yield stream


def tool_deltas(stream: bytes) -> list[ToolCallDelta]:
    """The tool-call deltas of one streamed answer, in order, decoded as loopd decodes them."""
    decoder = EventDecoder()
    events = [*decoder.feed(stream), *decoder.flush()]
    return [event for event in events if isinstance(event, ToolCallDelta)]


# Fewer tool rounds a turn than loopd's 16 (``TurnRules.max_rounds``): a model whose calls differ
# each round (no repeat for the guard) still ends its turn within this many requests.
MAX_ROUNDS = 3


@dataclass
class Agent:
    runtime: Runtime
    client: TappedClient

    async def turn(self, session: str, text: str) -> tuple[TurnOutcome, list[ToolCall]]:
        """A user message, then the turn, as the chat adapters run one; the outcome and the
        calls the model made in it."""
        state = self.runtime.ensure_session(session)
        before = len(self.calls(session))
        self.runtime.log.append_user(session, text, external_key=fresh_external_key())
        outcome = await self.runtime.run_turn(state, lambda status: None)
        return outcome, self.calls(session)[before:]

    def messages(self, session: str) -> list[str]:
        return self.runtime.log.replay_messages(session)

    def calls(self, session: str) -> list[ToolCall]:
        """The tool calls the model made, in order, as stored."""
        found: list[ToolCall] = []
        for text in self.messages(session):
            message = json.loads(text)
            for call in message.get("tool_calls") or ():
                function = call["function"]
                found.append(ToolCall(call["id"], function["name"], function["arguments"]))
        return found

    def result_of(self, session: str, call: ToolCall) -> str:
        """The stored tool-result message (its exact text) answering ``call``."""
        for text in self.messages(session):
            message: dict[str, Any] = json.loads(text)
            if message.get("role") == "tool" and message.get("tool_call_id") == call.id:
                return text
        raise AssertionError(f"no result for {call.id} in the log")


@asynccontextmanager
async def agent(
    server: devserver.RunningServer,
    state: Path,
    broker_url: str = "unix:/nonexistent",
    *,
    repeat_limit: int = 1,
    max_rounds: int | None = MAX_ROUNDS,
    model: str = devserver.TOOL_MODEL,
) -> AsyncIterator[Agent]:
    settings = load_settings(
        infer_url=server.url,
        model=model,
        broker_url=broker_url,
        state_dir=state,
        repeat_limit=repeat_limit,
        **devserver.MODEL_SETTINGS[model],
    )
    rules = TurnRules.of(settings, max_rounds=max_rounds or DEFAULT_MAX_ROUNDS)
    runtime = Runtime.open(settings, client_type=TappedClient, rules=rules)
    client = runtime.endpoints.servers[SHORTHAND_ENDPOINT].client
    assert isinstance(client, TappedClient)
    client.bodies, client.streams = [], []
    try:
        yield Agent(runtime, client)
    finally:
        await runtime.aclose()
