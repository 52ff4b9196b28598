"""An MCP call's result as the text the model reads (pure).

Text content is kept as it is. Structured content is shown as compact JSON when no text block
came with it (a server sending both is asked to put the same result in its text, and often puts
it there as JSON). Images, audio and resources are
never inlined: each becomes one line naming what was returned, its type and size, with the
server's names and URIs JSON-quoted so they stay on that line.
"""

from dataclasses import dataclass

import mcp_types as types

from brokerd.tools.wording import compact_json, quoted


@dataclass(frozen=True)
class MappedResult:
    text: str
    is_error: bool


def result_text(result: types.CallToolResult) -> MappedResult:
    lines = [block_text(block) for block in result.content]
    structured = result.structured_content
    if structured is not None and not any(
        isinstance(block, types.TextContent) for block in result.content
    ):
        lines.append(compact_json(structured))
    return MappedResult("\n".join(lines), result.is_error)


def block_text(block: types.ContentBlock) -> str:
    if isinstance(block, types.TextContent):
        return block.text
    if isinstance(block, types.ImageContent | types.AudioContent):
        return (
            f"[{block.type}: {quoted(block.mime_type)}, {base64_size(block.data)} bytes, not shown]"
        )
    if isinstance(block, types.ResourceLink):
        mime = f", {quoted(block.mime_type)}" if block.mime_type else ""
        return f"[resource link: {quoted(block.name)} at {quoted(block.uri)}{mime}]"
    resource = block.resource
    mime = f", {quoted(resource.mime_type)}" if resource.mime_type else ""
    if isinstance(resource, types.TextResourceContents):
        size = f"{len(resource.text.encode())} bytes of text"
    else:
        size = f"{base64_size(resource.blob)} bytes"
    return f"[resource: {quoted(resource.uri)}{mime}, {size}, not shown]"


def base64_size(data: str) -> int:
    """Bytes that base64 text decodes to (without decoding it)."""
    stripped = data.rstrip("=")
    return len(stripped) * 3 // 4
