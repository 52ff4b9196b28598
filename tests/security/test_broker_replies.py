"""What the tool broker's answers tell a caller about other calls."""

import json
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from brokerd.tools.app import create_broker_app
from brokerd.tools.settings import BrokerSettings

pytestmark = pytest.mark.anyio

SECRET_ARGUMENTS = {"timezone": "Antarctica/Troll"}


@pytest.mark.attack(
    attack="A reused call id reads back another call's tool and arguments",
    input="call_tool with a session and call id already used for another call",
    expected="409 saying only that the id was used",
)
async def test_a_conflict_does_not_quote_the_earlier_call(
    tmp_path: Path, observed: Callable[[str], None]
) -> None:
    app = create_broker_app(BrokerSettings(audit_db=tmp_path / "audit.db"))
    transport = httpx.ASGITransport(app=app)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://broker") as client:
            await client.post("/v1/find_tool", json={"session": "mm:x", "query": "clock_now"})
            first = {"session": "mm:x", "call_id": "call_1", "name": "clock_now"}
            answer = await client.post(
                "/v1/call_tool", json={**first, "arguments": SECRET_ARGUMENTS}
            )
            assert answer.status_code == 200
            probe = {"session": "mm:x", "call_id": "call_1", "name": "web_fetch", "arguments": {}}
            conflict = await client.post("/v1/call_tool", json=probe)
    finally:
        app.state.broker.close()
    error = conflict.json()["error"]
    observed(f"{conflict.status_code}: {error}")
    assert conflict.status_code == 409
    assert "already used" in error
    assert "Troll" not in error
    assert "clock_now" not in error
    assert json.dumps(SECRET_ARGUMENTS) not in conflict.text
