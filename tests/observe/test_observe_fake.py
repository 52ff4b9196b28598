"""A turn with tool calls on the fake llama-server and an in-process broker: what the two
daemons log and count, the status page during a live turn, and loopd's metrics socket."""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import httpx
import pytest

from brokerd.observe.metrics import BROKERD_METRICS
from brokerd.observe.middleware import instrument
from brokerd.tools.app import create_broker_app
from brokerd.tools.settings import BrokerSettings
from loopd.config import load_settings
from loopd.engine.progress import Phase, Status, phase_words
from loopd.observe.metrics import METRICS
from loopd.sessionlog.records import fresh_external_key
from loopd.sessions import Runtime
from loopd.status.server import create_app, serve_runtime
from loopd_dev.fakes.llama import (
    FakeLlama,
    ModelSpec,
    ScriptedReply,
    ScriptedToolCall,
    serve_fake_llama,
)
from tests.brokerd.tools.brokertools_support import serving, write_tool
from tests.observe.observe_support import captured_logs, eventually, sample, scraped, value

pytestmark = pytest.mark.anyio

MODEL = "fake-model"


@pytest.fixture
def sockets() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="ob") as tmp:
        yield Path(tmp)


@asynccontextmanager
async def broker(tmp_path: Path, sockets: Path) -> AsyncIterator[str]:
    catalogue = tmp_path / "catalogue"
    write_tool(
        catalogue,
        "echo_text",
        description="Echo a text back (for tests).",
        parameters={
            "type": "object",
            "properties": {"text": {"type": "string"}},
            "required": ["text"],
            "additionalProperties": False,
        },
        run={"kind": "command", "argv": ["echo", "echo:", "{text}"]},
    )
    settings = BrokerSettings(audit_db=tmp_path / "audit.db", catalogue_dir=catalogue)
    sock = sockets / "broker.sock"
    async with serving(instrument("broker", create_broker_app(settings)), uds=sock):
        yield f"unix:{sock}"


def open_runtime(llama: Path, broker_url: str, state: Path) -> Runtime:
    return Runtime.open(
        load_settings(
            infer_url=f"unix:{llama}",
            model=MODEL,
            broker_url=broker_url,
            state_dir=state,
            temperature=0.0,
            max_tokens=512,
            think_cap=0,  # no cap: 512 tokens leave a capped reasoning no room to answer
        )
    )


TOOL_ROUNDS = (
    ScriptedReply(tool_calls=(ScriptedToolCall("find_tool", '{"query": "echo a text"}'),)),
    ScriptedReply(
        tool_calls=(
            ScriptedToolCall("call_tool", '{"name": "echo_text", "arguments": {"text": "hi"}}'),
        )
    ),
    ScriptedReply(tool_calls=(ScriptedToolCall("list_dir", '{"path": "."}'),)),
    ScriptedReply(tool_calls=(ScriptedToolCall("no_such_tool", "{}"),)),
    ScriptedReply(content="All done."),
)


async def test_one_turn_is_logged_and_counted_by_both_daemons(
    tmp_path: Path, sockets: Path
) -> None:
    loopd, brokerd = METRICS.registry, BROKERD_METRICS.registry
    counted: dict[str, Callable[[], float]] = {
        "turns": lambda: sample(loopd, "loopd_turns_total", outcome="answered"),
        "turn requests": lambda: sample(
            loopd, "loopd_requests_total", kind="turn", outcome="complete"
        ),
        "follow-ups": lambda: sample(
            loopd, "loopd_requests_total", kind="tool_followup", outcome="complete"
        ),
        "prompt tokens": lambda: sample(loopd, "loopd_prompt_tokens_processed_total", kind="turn"),
        "ttfb": lambda: sample(loopd, "loopd_time_to_first_byte_seconds_count", kind="turn"),
        "list_dir": lambda: sample(loopd, "loopd_tool_calls_total", tool="list_dir", outcome="ok"),
        "find_tool": lambda: sample(
            loopd, "loopd_tool_calls_total", tool="find_tool", outcome="ok"
        ),
        "call_tool": lambda: sample(
            loopd, "loopd_tool_calls_total", tool="call_tool", outcome="ok"
        ),
        "unknown tool": lambda: sample(
            loopd, "loopd_tool_calls_total", tool="unknown", outcome="error"
        ),
        "brokerd echo_text": lambda: sample(
            brokerd, "brokerd_tool_calls_total", tool="echo_text", status="ok"
        ),
        "brokerd call_tool requests": lambda: sample(
            brokerd, "brokerd_requests_total", socket="broker", route="/v1/call_tool", status="200"
        ),
        "brokerd bytes": lambda: sample(
            brokerd, "brokerd_streamed_bytes_total", socket="broker", direction="to_box"
        ),
    }
    before = {name: read() for name, read in counted.items()}
    fake = FakeLlama(models=(ModelSpec(name=MODEL),))
    fake.push(*TOOL_ROUNDS)
    with captured_logs() as logs:
        async with (
            broker(tmp_path, sockets) as broker_url,
            serve_fake_llama(fake, uds=sockets / "llama.sock") as served,
        ):
            assert served.uds is not None
            runtime = open_runtime(served.uds, broker_url, tmp_path / "state")
            try:
                session = runtime.ensure_session("rounds")
                runtime.log.append_user("rounds", "Echo hi.", external_key=fresh_external_key())
                outcome = await runtime.run_turn(session, lambda status: None)
            finally:
                await runtime.aclose()
    assert outcome.answer == "All done."
    moved = {name: read() - before[name] for name, read in counted.items()}
    assert moved.pop("prompt tokens") > 0
    assert moved.pop("brokerd bytes") > 0
    assert moved == {
        "turns": 1,
        "turn requests": 1,
        "follow-ups": 4,
        "ttfb": 1,
        "list_dir": 1,
        "find_tool": 1,
        "call_tool": 1,
        "unknown tool": 1,
        "brokerd echo_text": 1,
        "brokerd call_tool requests": 1,
    }

    requests = [line for line in logs.of("loopd.") if line["msg"] == "model request"]
    tools = [line for line in logs.of("loopd.tools.calls")]
    ids = [line["request_id"] for line in requests + tools]
    assert len(requests) == 5
    assert [line["tool"] for line in tools] == ["find_tool", "call_tool", "list_dir", "unknown"]
    assert len(set(ids)) == len(ids), "one id per model request and per tool call"
    assert {line["session"] for line in requests + tools} == {"rounds"}
    [broker_line] = logs.of("brokerd.tools.calls")
    [call_tool_line] = [line for line in tools if line["tool"] == "call_tool"]
    assert broker_line["request_id"] == call_tool_line["request_id"]
    assert broker_line["session"] == "rounds"
    assert broker_line["tool"] == "echo_text"
    assert broker_line["status"] == "ok"
    assert broker_line["socket"] == "broker"


async def test_the_status_page_shows_a_live_turn_and_its_phase(
    tmp_path: Path, sockets: Path
) -> None:
    fake = FakeLlama(models=(ModelSpec(name=MODEL),))
    async with serve_fake_llama(fake, uds=sockets / "llama.sock") as served:
        assert served.uds is not None
        runtime = open_runtime(served.uds, f"unix:{sockets}/none.sock", tmp_path / "state")
        app = create_app(runtime)
        page = httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://loopd")
        try:
            session = runtime.ensure_session("mm:live")
            runtime.log.append_user("mm:live", "hello there", external_key=fresh_external_key())
            # Another client holds the slot, so the turn waits, queued on the server.
            fake.faults.set(stall_before_first_byte=True)
            blocker = {"model": MODEL, "id_slot": 0, "messages": [{"role": "user", "content": "x"}]}
            async with anyio.create_task_group() as tg:

                async def other_client() -> None:
                    async with served.client() as other:
                        await other.post("/v1/chat/completions", json=blocker)

                tg.start_soon(other_client)
                await eventually(lambda: fake.model().slots.slots[0].is_processing, "the blocker")
                outcome: list[object] = []

                async def turn() -> None:
                    outcome.append(await runtime.run_turn(session, lambda status: None))

                tg.start_soon(turn)

                def queued() -> bool:
                    live = runtime.live.get("mm:live")
                    return live is not None and live.phase == phase_words(Status(Phase.QUEUED))

                await eventually(queued, "the turn to be queued on the server")
                during = (await page.get("/")).text
                metrics_during = scraped((await page.get("/metrics")).text)
                fake.faults.set(stall_before_first_byte=False)
            after = (await page.get("/")).text
            status = (await page.get("/status.json")).json()
        finally:
            await page.aclose()
            await runtime.aclose()
    assert '<meta http-equiv="refresh"' in during
    queued_row = (
        '<span class="busy">busy</span></td><td><code><bdi>mm:live</bdi></code></td>'
        "<td><bdi>queued behind"
    )
    assert queued_row in during
    assert "<script" not in during
    assert value(metrics_during, "loopd_slot_busy", endpoint="default", slot="0") == 1
    assert value(metrics_during, "loopd_sessions_active") == 1
    assert '<span class="idle">idle</span>' in after
    assert "no turn is under way" in after
    assert "<svg" in after
    assert "<polyline" in after
    [listed] = status["sessions"]
    assert listed["name"] == "mm:live"
    assert listed["requests"] == 1
    assert listed["last_turn_at"]


async def test_metrics_are_served_on_a_unix_socket_until_cancelled(
    tmp_path: Path, sockets: Path
) -> None:
    runtime = Runtime.open(load_settings(state_dir=tmp_path / "state", model=MODEL))
    address = sockets / "metrics.sock"
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(serve_runtime, runtime, f"unix:{address}")
            assert address.is_socket()
            assert oct(address.stat().st_mode & 0o777) == oct(0o660)
            transport = httpx.AsyncHTTPTransport(uds=str(address))
            async with httpx.AsyncClient(transport=transport, base_url="http://loopd") as client:
                response = await client.get("/metrics")
                missing = await client.get("/nothing")
            tg.cancel_scope.cancel()
    finally:
        await runtime.aclose()
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    page = scraped(response.text)
    assert ("loopd_turns_total", (("outcome", "answered"),)) in page
    assert missing.status_code == 404
    assert not address.exists(), "the socket file is removed when serving ends"


async def test_a_stale_socket_is_replaced_and_a_file_is_refused(
    tmp_path: Path, sockets: Path
) -> None:
    from loopcommon.httpserve import MetricsServeError

    runtime = Runtime.open(load_settings(state_dir=tmp_path / "state", model=MODEL))
    plain = sockets / "plain"
    plain.write_text("not a socket")
    try:
        with pytest.raises(MetricsServeError, match="exists and is not a socket"):
            await serve_runtime(runtime, f"unix:{plain}")
        assert plain.read_text() == "not a socket"
    finally:
        await runtime.aclose()
