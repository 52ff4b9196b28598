"""A small client for brokerd's tool broker socket, as loopd uses it: find_tool, then call_tool."""

import secrets
from pathlib import Path
from typing import Any

import httpx


class BrokerClient:
    def __init__(self, socket: Path, session: str = "attacker") -> None:
        transport = httpx.HTTPTransport(uds=str(socket))
        self.http = httpx.Client(transport=transport, base_url="http://broker", timeout=60.0)
        self.session = session

    def find(self, query: str) -> list[str]:
        response = self.http.post("/v1/find_tool", json={"session": self.session, "query": query})
        response.raise_for_status()
        names: list[str] = response.json()["names"]
        return names

    def call(self, name: str, arguments: Any = None) -> dict[str, Any]:
        """find_tool for ``name`` first (the broker requires it), then call it."""
        assert name in self.find(name), f"find_tool does not offer {name}"
        body = {
            "session": self.session,
            "call_id": "call-" + secrets.token_hex(8),
            "name": name,
            "arguments": arguments if arguments is not None else {},
        }
        response = self.http.post("/v1/call_tool", json=body)
        assert response.status_code == 200, response.text
        answer: dict[str, Any] = response.json()
        return answer

    def close(self) -> None:
        self.http.close()
