"""A hostile MCP server over stdio, in plain JSON-RPC lines (no SDK, so it can misbehave):
``python fake_mcp.py MODE [MARKER]``.

- ``silent``: reads its input and never answers ``initialize``.
- ``stalled-list``: answers ``initialize``, never answers ``tools/list``.
- ``huge-pages``: every ``tools/list`` page is one tool with a 2 MB description and a next
  cursor, for ever.
- ``patterns``: tools whose input schemas have patterns that backtrack catastrophically in
  Python's ``re`` (``slug``, ``words``) or that need backtracking (``echo_twice``, with a
  backreference; ``lookahead``).
"""

import json
import sys

HUGE_DESCRIPTION_CHARS = 2_000_000
CATASTROPHIC = "^([a-z0-9]+-?)*$"

PATTERN_TOOLS = [
    {
        "name": "slug",
        "description": "Echo a slug.",
        "inputSchema": {
            "type": "object",
            "properties": {"slug": {"type": "string", "pattern": CATASTROPHIC}},
        },
    },
    {
        "name": "words",
        "description": "Echo words, keyed by a name made of words.",
        "inputSchema": {
            "type": "object",
            "patternProperties": {"^(\\w+\\s?)*$": {"type": "string"}},
            "additionalProperties": False,
        },
    },
    {
        "name": "echo_twice",
        "description": "A text said twice.",
        "inputSchema": {
            "type": "object",
            "properties": {"text": {"type": "string", "pattern": "^(a+)\\1$"}},
        },
    },
    {
        "name": "lookahead",
        "description": "A password.",
        "inputSchema": {
            "type": "object",
            "properties": {"text": {"type": "string", "pattern": "^(?=.*[0-9]).+$"}},
        },
    },
]


def send(message: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def answer(mode: str, request: dict[str, object]) -> dict[str, object] | None:
    method = request.get("method")
    if method == "initialize":
        if mode == "silent":
            return None
        params = request.get("params")
        version = params.get("protocolVersion") if isinstance(params, dict) else None
        return {
            "protocolVersion": version or "2025-06-18",
            "capabilities": {"tools": {}},
            "serverInfo": {"name": f"fake-{mode}", "version": "1"},
        }
    if method == "tools/list":
        if mode == "stalled-list":
            return None
        if mode == "huge-pages":
            params = request.get("params")
            cursor = params.get("cursor") if isinstance(params, dict) else None
            page = int(str(cursor or "0"))
            tool = {
                "name": f"page{page}",
                "description": "x" * HUGE_DESCRIPTION_CHARS,
                "inputSchema": {"type": "object"},
            }
            return {"tools": [tool], "nextCursor": str(page + 1)}
        return {"tools": PATTERN_TOOLS}
    if method == "tools/call":
        return {"content": [{"type": "text", "text": "ran"}]}
    if method == "ping":
        return {}
    return None


def main() -> None:
    mode = sys.argv[1]
    for line in sys.stdin:
        request = json.loads(line)
        if "id" not in request:
            continue  # a notification
        result = answer(mode, request)
        if result is not None:
            send({"jsonrpc": "2.0", "id": request["id"], "result": result})


if __name__ == "__main__":
    main()
