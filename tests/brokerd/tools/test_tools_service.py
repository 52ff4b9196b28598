"""ToolBroker with a gated builtin: concurrent duplicates and cancellation, step by step."""

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest

from brokerd.tools.audit import AuditLog
from brokerd.tools.builtins import BuiltinContext
from brokerd.tools.catalogue import build_catalogue, parse_tool
from brokerd.tools.service import CallAnswer, ToolBroker
from brokerd.tools.settings import BrokerSettings
from loopcommon.capture import CappedOutput

pytestmark = pytest.mark.anyio

GATE_TOOL = """{"name": "gate", "description": "Waits for the test to open it.",
"parameters": {"type": "object"}, "run": {"kind": "builtin", "handler": "gate"}}"""


class Gate:
    """A builtin that counts its runs and waits until the test opens it."""

    def __init__(self) -> None:
        self.runs = 0
        self.entered = anyio.Event()
        self.opened = anyio.Event()

    async def __call__(
        self, arguments: Mapping[str, Any], output: CappedOutput, context: BuiltinContext
    ) -> None:
        self.runs += 1
        self.entered.set()
        await self.opened.wait()
        output.add(b"gate passed")


@pytest.fixture
def gate() -> Gate:
    return Gate()


@pytest.fixture
def broker(tmp_path: Path, gate: Gate) -> ToolBroker:
    settings = BrokerSettings(audit_db=tmp_path / "audit.db", catalogue_dir=tmp_path)
    catalogue = build_catalogue(
        [("gate.json", parse_tool("gate.json", GATE_TOOL, "json", {"gate"}))]
    )
    broker = ToolBroker(settings, catalogue, AuditLog.open(settings.audit_db), {"gate": gate})
    broker.find_tool("s", "gate")
    return broker


async def test_concurrent_duplicates_run_once(broker: ToolBroker, gate: Gate) -> None:
    answers: list[CallAnswer] = []

    async def call() -> None:
        answers.append(await broker.call_tool("s", "c1", "gate", "{}"))

    async with anyio.create_task_group() as group:
        group.start_soon(call)
        await gate.entered.wait()
        # The first call is inside the tool now; these arrive while it runs.
        group.start_soon(call)
        group.start_soon(call)
        await anyio.wait_all_tasks_blocked()
        assert answers == []
        gate.opened.set()

    assert gate.runs == 1
    assert answers[0] == CallAnswer("gate passed", "ok")
    assert answers[1:] == [CallAnswer("gate passed", "replayed", "ok")] * 2
    broker.close()


async def test_cancelled_call_is_recorded_as_interrupted(broker: ToolBroker, gate: Gate) -> None:
    async with anyio.create_task_group() as group:
        group.start_soon(broker.call_tool, "s", "c1", "gate", "{}")
        await gate.entered.wait()
        group.cancel_scope.cancel()

    replay = await broker.call_tool("s", "c1", "gate", "{}")
    assert replay.status == "replayed"
    assert replay.recorded_status == "interrupted"
    assert "may or may not have taken effect" in replay.result
    assert gate.runs == 1
    broker.close()
