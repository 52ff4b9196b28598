"""brokerd enforces approvals: a call of a tool that asks runs only with a decision brokerd
issued for that very call, and the audit log holds the question and the decision."""

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from brokerd.approval import (
    ApprovalBody,
    Asked,
    Decided,
    NotThisCall,
    Pending,
    approval_mode,
    gate,
)
from brokerd.mcp.config import McpServerConfig
from brokerd.tools.app import create_broker_app
from brokerd.tools.catalogue import ToolSpec
from brokerd.tools.settings import BrokerSettings
from loopcommon.errors import ConfigError
from tests.brokerd.tools.brokertools_support import python_tool, write_tool
from tests.mcp.test_mcp_cli import brokerd, toml_config

pytestmark = pytest.mark.anyio


class Broker:
    def __init__(self, client: httpx.AsyncClient, root: Path) -> None:
        self.client, self.root = client, root

    async def call(self, call_id: str, approval: dict[str, str] | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "session": "s1",
            "call_id": call_id,
            "name": "writer",
            "arguments": "{}",
        }
        if approval is not None:
            body["approval"] = approval
        response = await self.client.post("/v1/call_tool", json=body)
        assert response.status_code == 200, response.text
        answer: dict[str, Any] = response.json()
        return answer

    def written(self) -> str:
        path = self.root / "out" / "written"
        return path.read_text() if path.exists() else ""

    def approvals(self) -> list[tuple[Any, ...]]:
        with sqlite3.connect(self.root / "audit.db") as db:
            return list(db.execute("SELECT call_id, tool, decision, by FROM approvals"))


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[Broker]:
    out = tmp_path / "out"
    out.mkdir()
    catalogue = tmp_path / "catalogue"
    python_tool(
        catalogue,
        "writer",
        "import sys; open(sys.argv[1], 'a').write('x'); print('wrote')",
        str(out / "written"),
        writable=out,
    )
    app = create_broker_app(BrokerSettings(audit_db=tmp_path / "audit.db", catalogue_dir=catalogue))
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://broker")
    found = await client.post("/v1/find_tool", json={"session": "s1", "query": "writer"})
    assert "writer" in found.json()["names"]
    try:
        yield Broker(client, tmp_path)
    finally:
        await client.aclose()
        app.state.broker.close()


async def test_a_call_without_approval_is_refused_and_runs_nothing(broker: Broker) -> None:
    first = await broker.call("c1")
    assert first["status"] == "needs_approval"
    assert "needs a person's approval" in first["result"]
    assert first["approval_id"] not in first["result"]  # the model never reads the id
    again = await broker.call("c1")
    assert again["approval_id"] == first["approval_id"]  # one question per call
    assert broker.written() == ""
    assert broker.approvals() == [("c1", "writer", None, None)]


async def test_an_allowed_call_runs_once_and_says_who_allowed_it(broker: Broker) -> None:
    asked = await broker.call("c1")
    decision = {"id": asked["approval_id"], "decision": "allow", "by": "@alice"}
    answer = await broker.call("c1", decision)
    assert answer == {"result": "Allowed by @alice.\nwrote", "status": "ok"}
    assert broker.written() == "x"
    replayed = await broker.call("c1", decision)
    assert replayed["status"] == "replayed"
    assert broker.written() == "x"
    assert broker.approvals() == [("c1", "writer", "allow", "@alice")]


async def test_a_denied_call_runs_nothing_and_says_who_denied_it(broker: Broker) -> None:
    asked = await broker.call("c1")
    answer = await broker.call("c1", {"id": asked["approval_id"], "decision": "deny", "by": "@bob"})
    assert answer["status"] == "denied"
    assert answer["result"].startswith("writer was not run: @bob denied this call.")
    assert broker.written() == ""
    assert broker.approvals() == [("c1", "writer", "deny", "@bob")]


async def test_a_timed_out_call_runs_nothing(broker: Broker) -> None:
    asked = await broker.call("c1")
    by = "no answer within 10 minutes"
    answer = await broker.call("c1", {"id": asked["approval_id"], "decision": "timeout", "by": by})
    assert answer["status"] == "denied"
    assert "nobody allowed it in time (no answer within 10 minutes)" in answer["result"]
    assert broker.written() == ""


async def test_an_approval_cannot_be_forged_or_moved_to_another_call(broker: Broker) -> None:
    asked = await broker.call("c1")
    forged = await broker.call("c1", {"id": "made-up", "decision": "allow", "by": "@alice"})
    assert forged["status"] == "refused"
    assert "did not issue" in forged["result"]
    await broker.call("c2")
    moved = await broker.call("c2", {"id": asked["approval_id"], "decision": "allow", "by": "x"})
    assert moved["status"] == "refused"
    assert broker.written() == ""
    # The refusals left the call's key free: the real decision still works.
    allowed = await broker.call("c1", {"id": asked["approval_id"], "decision": "allow", "by": "a"})
    assert allowed["status"] == "ok"
    assert broker.written() == "x"


def spec(**fields: Any) -> ToolSpec:
    run = {"kind": "command", "argv": ["true"]}
    return ToolSpec.model_validate(
        {"name": "t", "description": "d", "parameters": {"type": "object"}, "run": run, **fields}
    )


def test_the_mode_follows_the_config_then_the_tool_then_what_it_declares() -> None:
    assert approval_mode(spec(), {}) == "auto"
    assert approval_mode(spec(confine={"network": True}), {}) == "ask"
    assert approval_mode(spec(confine={"read_write": ["/srv"]}), {}) == "ask"
    assert approval_mode(spec(confine={"network": True}, approval="auto"), {}) == "auto"
    assert approval_mode(spec(approval="auto"), {"t": "ask"}) == "ask"
    builtin = spec(run={"kind": "builtin", "handler": "x"})
    assert approval_mode(builtin, {}) == "auto"


def test_an_mcp_servers_tools_ask_when_it_may_act_on_the_world() -> None:
    assert McpServerConfig(name="t", command=("srv",)).approval_mode() == "auto"
    assert McpServerConfig(name="t", command=("srv",), network=True).approval_mode() == "ask"
    assert McpServerConfig(name="t", command=("srv",), paths=("/srv:rw",)).approval_mode() == "ask"
    assert McpServerConfig(name="t", url="http://h/mcp").approval_mode() == "ask"
    assert McpServerConfig(name="t", url="http://h/mcp", approval="auto").approval_mode() == "auto"


async def test_a_catalogue_file_may_ask_for_a_tool_that_declares_nothing(tmp_path: Path) -> None:
    write_tool(tmp_path / "cat", "clock", approval="ask")
    app = create_broker_app(
        BrokerSettings(audit_db=tmp_path / "a.db", catalogue_dir=tmp_path / "cat")
    )
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://b"
    ) as client:
        await client.post("/v1/find_tool", json={"session": "s", "query": "clock"})
        body = {"session": "s", "call_id": "c", "name": "clock", "arguments": "{}"}
        answer = (await client.post("/v1/call_tool", json=body)).json()
    app.state.broker.close()
    assert answer["status"] == "needs_approval"


def test_a_misspelt_name_in_the_approval_table_stops_brokerd(tmp_path: Path) -> None:
    write_tool(tmp_path / "cat", "clock")
    settings = BrokerSettings(
        audit_db=tmp_path / "a.db",
        catalogue_dir=tmp_path / "cat",
        approval={"clokc": "ask", "fs.write": "auto"},
    )
    with pytest.raises(ConfigError) as refused:
        create_broker_app(settings)
    assert str(refused.value) == (
        "BROKERD_BROKER__APPROVAL: `clokc`: the catalogue has no such tool (did you mean "
        "`clock`?); `fs.write`: no [[mcp]] server is configured"
    )


ASKED = Asked("id1", "s", "c1", "sha-a", "writer", "t0")


def test_a_call_id_asked_about_cannot_carry_another_call() -> None:
    assert isinstance(gate(ASKED, "s", "c1", "sha-b", None), NotThisCall)
    allow = ApprovalBody(id="id1", decision="allow", by="@a")
    assert isinstance(gate(ASKED, "s", "c1", "sha-b", allow), NotThisCall)
    assert gate(ASKED, "s", "c1", "sha-a", None) == Pending("id1")
    assert gate(None, "s", "c1", "sha-a", None) == Pending(None)


def test_a_recorded_decision_stands_and_cannot_change() -> None:
    decided = Asked("id1", "s", "c1", "sha-a", "writer", "t0", "allow", "@a")
    assert gate(decided, "s", "c1", "sha-a", None) == Decided("allow", "@a", new=False)
    deny = ApprovalBody(id="id1", decision="deny", by="@b")
    assert isinstance(gate(decided, "s", "c1", "sha-a", deny), NotThisCall)
    allow = ApprovalBody(id="id1", decision="allow", by="@a")
    assert gate(ASKED, "s", "c1", "sha-a", allow) == Decided("allow", "@a", new=True)


def test_both_commands_refuse_a_misspelt_tool_with_its_own_name_and_a_suggestion(
    tmp_path: Path,
) -> None:
    config = toml_config(tmp_path, '[broker.approval]\ngit_lgo = "ask"\n')
    refused = (
        "BROKERD_BROKER__APPROVAL: `git_lgo`: the catalogue has no such tool (did you mean "
        "`git_log`?)\n"
    )
    listed = brokerd(config, "tools", "list")
    assert (listed.returncode, listed.stderr) == (2, f"brokerd: bad config: {refused}")
    served = brokerd(config, "serve", "--only", "broker")
    assert (served.returncode, served.stderr) == (2, f"brokerd: {refused}")
