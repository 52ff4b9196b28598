"""The engine on the production-shaped hybrid preset (``qwen35moe``: a recurrent state beside the
attention layers, four slots on one unified pool that clears idle slots): the self-test's pool
answer unpins the sessions, and every cache loss of two sessions taking turns has a named cause
(docs/production-shape.md, "What loopd's engine must change", items 1 and 3)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from loopd.config import CORE_TOOLS_FILE, load_settings
from loopd.engine.perf import LossCause
from loopd.selftest.run import run_selftest
from loopd.serve import ServerWatch
from loopd.sessionlog.records import fresh_external_key
from loopd.sessionlog.verify import verify
from loopd.sessions import Runtime
from loopd.tools.spec import load_tools_spec
from loopd_dev import devserver

pytestmark = [pytest.mark.real_server, pytest.mark.anyio]


@pytest.fixture
def hybrid_server(tmp_path: Path) -> Iterator[devserver.RunningServer]:
    try:
        with devserver.running(
            tmp_path / "server",
            devserver.default_cache_dir(),
            socket_path=tmp_path / "server" / "llama.sock",
            load=(devserver.HYBRID_MODEL,),
        ) as server:
            yield server
    except devserver.DevServerError as exc:
        pytest.fail(f"the real llama-server with the hybrid preset is required: {exc}")


async def test_sessions_taking_turns_on_the_hybrid_pool_name_every_loss(
    hybrid_server: devserver.RunningServer, tmp_path: Path
) -> None:
    settings = load_settings(
        infer_url=hybrid_server.url,
        model=devserver.HYBRID_MODEL,
        state_dir=tmp_path / "state",
        slots=(0, 1),
        max_tokens=48,
        think_cap=0,  # the random model never ends its thinking (docs/production-shape.md)
    )
    tools_text = load_tools_spec(CORE_TOOLS_FILE).text
    report = await run_selftest(settings, tools_text=tools_text)
    assert report.ok, [r for r in report.results if not r.ok]
    assert report.idle_slots_cleared is True
    runtime = Runtime.open(settings)
    try:
        ServerWatch(settings, runtime).start(report)
        assert runtime.server is not None
        assert not runtime.server.placement.pinned
        for number in range(4):
            for name in ("north", "south"):
                session = runtime.ensure_session(name)
                text = f"Message {number} of {name}: tell me about the weather."
                await runtime.append_user(name, text, external_key=fresh_external_key())
                outcome = await runtime.run_turn(session, lambda status: None)
                assert outcome.failure is None, outcome.failure
        records = [r.record for name in ("north", "south") for r in runtime.log.requests(name)]
        problems = verify(runtime.log)
    finally:
        await runtime.aclose()
    losses = [(r.perf.cache_n, r.perf.cache_loss, r.perf.cache_loss_cause) for r in records]
    assert all(cause for _, lost, cause in losses if lost), losses
    assert not [loss for loss in losses if loss[2] == LossCause.UNEXPLAINED], losses
    assert sum(bool(lost) for _, lost, _ in losses) >= 1, "the hybrid pool lost something"
    assert problems == []
