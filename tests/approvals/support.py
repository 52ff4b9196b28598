"""A brokerd tool that asks before it runs, and a scripted model that calls it."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from brokerd.tools.app import create_broker_app
from brokerd.tools.settings import BrokerSettings
from loopd.sessionlog.records import EntryKind
from loopd.sessionlog.store import SessionLog
from loopd_dev.fakes.llama import FakeLlama, ScriptedReply, ScriptedToolCall
from tests.brokerd.tools.brokertools_support import serving, write_tool

TOOL = "echo_text"


@asynccontextmanager
async def asking_broker(root: Path, sockets: Path) -> AsyncIterator[str]:
    """brokerd's broker with one command tool that asks (``approval = "ask"``): its URL."""
    catalogue = root / "catalogue"
    write_tool(
        catalogue,
        TOOL,
        description="Echo a text back (for tests).",
        parameters={
            "type": "object",
            "properties": {"text": {"type": "string"}},
            "required": ["text"],
            "additionalProperties": False,
        },
        run={"kind": "command", "argv": ["echo", "echo:", "{text}"]},
        approval="ask",
    )
    app = create_broker_app(BrokerSettings(audit_db=root / "audit.db", catalogue_dir=catalogue))
    sock = sockets / "broker.sock"
    async with serving(app, uds=sock):
        yield f"unix:{sock}"


def script_a_call(fake: FakeLlama, model: str, text: str = "hi", answer: str = "Done.") -> None:
    """The model finds the tool, calls it, then answers."""
    call = json.dumps({"name": TOOL, "arguments": {"text": text}})
    fake.push(
        ScriptedReply(tool_calls=(ScriptedToolCall("find_tool", '{"query": "echo a text"}'),)),
        ScriptedReply(tool_calls=(ScriptedToolCall("call_tool", call),)),
        ScriptedReply(content=answer),
        model=model,
    )


def tool_results(db: Path, session: str) -> list[str]:
    """The text of each tool result the model read, in order."""
    with SessionLog.open(db) as log:
        entries = [e for e in log.entries(session) if e.kind is EntryKind.TOOL]
    return [str(json.loads(str(e.message))["content"]) for e in entries]


def notes(db: Path, session: str) -> list[str]:
    with SessionLog.open(db) as log:
        return [str(e.fields.text) for e in log.entries(session) if e.kind is EntryKind.NOTE]


def audit_approvals(root: Path) -> list[tuple[Any, ...]]:
    with sqlite3.connect(root / "audit.db") as db:
        return list(db.execute("SELECT tool, decision, by FROM approvals"))
