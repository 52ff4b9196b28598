"""The wire layer: llama-server's streamed chat completions, parsed without I/O.

`SSEDecoder` turns response bytes into SSE items, `parse_payload` (or `EventDecoder` for bytes)
turns them into typed `StreamEvent`s, and `StreamAssembler` folds the events into the
`AssistantMessage` to replay, the server's counters and the stream's `StreamOutcome`.
"""

from loopd.wire.assemble import AssistantMessage, StreamAssembler, StreamOutcome, ToolCall
from loopd.wire.events import (
    ChunkMeta,
    EventDecoder,
    Foreign,
    KeepAlive,
    Progress,
    ReasoningDelta,
    ServerError,
    StreamEvent,
    Timings,
    ToolCallDelta,
    Usage,
    events_from_item,
)
from loopd.wire.sse import SSEData, SSEDecoder, SSEItem

__all__ = [
    "AssistantMessage",
    "ChunkMeta",
    "EventDecoder",
    "Foreign",
    "KeepAlive",
    "Progress",
    "ReasoningDelta",
    "SSEData",
    "SSEDecoder",
    "SSEItem",
    "ServerError",
    "StreamAssembler",
    "StreamEvent",
    "StreamOutcome",
    "Timings",
    "ToolCall",
    "ToolCallDelta",
    "Usage",
    "events_from_item",
]
