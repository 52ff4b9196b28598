"""The public surface of loopd.wire, pinned so that a change to it is a decision."""

import loopd.wire


def test_public_names() -> None:
    assert sorted(loopd.wire.__all__) == [
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
    assert all(hasattr(loopd.wire, name) for name in loopd.wire.__all__)
