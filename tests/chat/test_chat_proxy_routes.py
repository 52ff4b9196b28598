"""Every Mattermost call the adapter makes is one brokerd's chat proxy lets through.

The proxy's allowlist and the adapter's client are written apart; in the box the adapter reaches
Mattermost only through the proxy, so a call missing from the allowlist silently disables the
daemon (it happened once: GET /users/me/teams).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from brokerd.proxy.chat import refusal

REST_SOURCE = Path(__file__).parents[2] / "loopd" / "chat" / "rest.py"
ID = "abcdefghijklmnopqrstuvwxyz"


def adapter_calls() -> list[tuple[str, str]]:
    """(method, path) of every ``self.call(METHOD, PATH, ...)`` in the REST client."""
    text = REST_SOURCE.read_text()
    found = re.findall(r'call\(\s*"([A-Z]+)",\s*f?"([^"]+)"', text)
    return [(method, re.sub(r"\{[^}]+\}", ID, path)) for method, path in found]


def test_the_adapter_makes_calls() -> None:
    assert len(adapter_calls()) >= 8


@pytest.mark.parametrize(("method", "path"), adapter_calls())
def test_each_adapter_call_passes_the_chat_proxy(method: str, path: str) -> None:
    assert refusal(method, f"/api/v4{path}", b"") is None
