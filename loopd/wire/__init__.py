"""The wire layer: llama-server's streamed chat completions, parsed without I/O.

`SSEDecoder` turns response bytes into SSE items, `parse_payload` (or `EventDecoder` for bytes)
turns them into typed `StreamEvent`s, and `StreamAssembler` folds the events into the
`AssistantMessage` to replay, the server's counters and the stream's `StreamOutcome`.
"""

from loopd.wire.assemble import AssistantMessage, StreamAssembler, StreamOutcome, ToolCall
from loopd.wire.events import (
    ChunkMeta,
    ContentDelta,
    Done,
    EventDecoder,
    Finish,
    Foreign,
    KeepAlive,
    Malformed,
    Progress,
    ReasoningDelta,
    RoleStart,
    ServerError,
    StreamEvent,
    Timings,
    ToolCallDelta,
    Usage,
    events_from_item,
    parse_payload,
)
from loopd.wire.sse import SSEComment, SSEData, SSEDecoder, SSEForeign, SSEItem

__all__ = [
    "AssistantMessage",
    "ChunkMeta",
    "ContentDelta",
    "Done",
    "EventDecoder",
    "Finish",
    "Foreign",
    "KeepAlive",
    "Malformed",
    "Progress",
    "ReasoningDelta",
    "RoleStart",
    "SSEComment",
    "SSEData",
    "SSEDecoder",
    "SSEForeign",
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
    "parse_payload",
]
