"""The public surface of loopd.wire, pinned so that a change to it is a decision."""

import loopd.wire


def test_public_names() -> None:
    # The names loopd imports from the package (tests/test_architecture.py keeps each
    # re-export used); the wire's other names are imported from their modules.
    assert sorted(loopd.wire.__all__) == [
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
    assert all(hasattr(loopd.wire, name) for name in loopd.wire.__all__)
