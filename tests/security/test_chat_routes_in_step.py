"""The chat proxy's route list and the calls loopd's Mattermost adapter makes are the same list.

The adapter is read from its source (loopd/chat/rest.py and ws.py) rather than run: every
``self.call(METHOD, PATH, ...)``, the path given literally, as an f-string or through a local
variable, and the WebSocket path. A route the adapter never calls is one more thing the box can
do with the bot token; a call the proxy lacks silently disables the daemon in the box.
"""

import ast
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from brokerd.proxy.chat import CHAT_ROUTES

LOOPD_CHAT = Path(__file__).parents[2] / "loopd" / "chat"
API = "/api/v4"
# Calls made through a streamed read rather than ``self.call``: the method each one uses.
STREAMED_READS = {"_head_once": "GET"}


def _template(node: ast.expr, local: dict[str, ast.expr]) -> str | None:
    """A path argument as a template with ``{id}`` for each interpolated value."""
    if isinstance(node, ast.Name) and node.id in local:
        return _template(local[node.id], local)
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = []
        for value in node.values:
            if isinstance(value, ast.Constant):
                parts.append(str(value.value))
            else:
                parts.append("{id}")
        return "".join(parts)
    return None


def adapter_calls() -> set[tuple[str, str]]:
    calls = set()
    tree = ast.parse((LOOPD_CHAT / "rest.py").read_text())
    for function in ast.walk(tree):
        if not isinstance(function, ast.AsyncFunctionDef | ast.FunctionDef):
            continue
        local = {
            target.id: node.value
            for node in ast.walk(function)
            if isinstance(node, ast.Assign)
            for target in node.targets
            if isinstance(target, ast.Name)
        }
        for node in ast.walk(function):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "call"
                and len(node.args) >= 2
                and isinstance(node.args[0], ast.Constant)
            ):
                path = _template(node.args[1], local)
                assert path is not None, f"cannot read the path of {ast.unparse(node)}"
                calls.add((str(node.args[0].value), path))
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in STREAMED_READS
                and node.args
            ):
                path = _template(node.args[0], local)
                assert path is not None, f"cannot read the path of {ast.unparse(node)}"
                calls.add((STREAMED_READS[node.func.attr], path))
    websocket = re.findall(r"/api/v4(/websocket)\b", (LOOPD_CHAT / "ws.py").read_text())
    calls.update(("GET", path) for path in set(websocket))
    return calls


def proxy_routes() -> set[tuple[str, str]]:
    return {
        (route.method, re.sub(r"\{[a-z_]+\}", "{id}", route.template.removeprefix(API)))
        for route in CHAT_ROUTES
    }


@pytest.mark.attack(
    attack="The chat proxy allows calls loopd never makes (each runs with the bot token)",
    input="the proxy's route list against every call in loopd/chat/rest.py and ws.py",
    expected="the same list",
)
def test_the_proxy_allows_exactly_the_adapters_calls(observed: Callable[[str], None]) -> None:
    calls, routes = adapter_calls(), proxy_routes()
    # The adapter was read whole: a path passed through a local variable, and the socket.
    assert {("GET", "/channels/{id}/posts"), ("GET", "/websocket")} <= calls
    missing, extra = sorted(calls - routes), sorted(routes - calls)
    observed(f"{len(routes)} routes, {len(calls)} adapter calls; missing {missing}, extra {extra}")
    assert missing == [], "the adapter makes calls the proxy refuses"
    assert extra == [], "the proxy allows calls the adapter never makes"
