"""The engine on the production-shaped hybrid preset (``qwen35moe``: a recurrent state beside the
attention layers, four slots on one unified pool that clears idle slots): the self-test's pool
answer unpins the sessions, every cache loss of two sessions taking turns has a named cause, and
a low thinking cap ends every turn's thinking and the turn is answered (docs/production-shape.md,
"What loopd's engine must change", items 1, 3 and 8)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from loopd.config import CORE_TOOLS_FILE, SHORTHAND_ENDPOINT, load_settings
from loopd.engine.cacheloss import LossCause
from loopd.engine.client import InferenceClient
from loopd.engine.limits import Limits
from loopd.observe.metrics import METRICS
from loopd.selftest.run import run_selftest
from loopd.sessionlog.records import fresh_external_key
from loopd.sessionlog.verify import verify
from loopd.sessions import Runtime
from loopd.tools.spec import load_tools_spec
from loopd_dev import devserver
from tests.engine.engine_support import one_server

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
    runtime = Runtime.open(settings, selftest={SHORTHAND_ENDPOINT: report.answers})
    try:
        assert not one_server(runtime).known.pinning.pinned
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


async def test_the_end_of_thinking_the_server_forces_is_text_to_the_model(
    hybrid_server: devserver.RunningServer,
) -> None:
    """The template's end of thinking tokenizes and detokenizes back to itself, so the server's
    reasoning parser sees the tag it forces (test-llama-archs' own vocabulary gave back hex)."""
    forced = "\n</think>\n"
    async with InferenceClient(hybrid_server.url, devserver.HYBRID_MODEL) as client:
        body = {"model": devserver.HYBRID_MODEL, "content": forced}
        tokens = (await client.post_json("/tokenize", body, 30))["tokens"]
        body = {"model": devserver.HYBRID_MODEL, "tokens": tokens}
        back = (await client.post_json("/detokenize", body, 30))["content"]
    assert back == forced, tokens


async def test_a_low_thinking_cap_ends_every_turn_and_each_is_answered(
    hybrid_server: devserver.RunningServer, tmp_path: Path
) -> None:
    """The cap's control call ends the thinking (the server writes the template's ``</think>``
    and its parser sees it: the model's vocabulary round-trips), and the model answers."""
    cap = 24
    settings = load_settings(
        infer_url=hybrid_server.url,
        model=devserver.HYBRID_MODEL,
        state_dir=tmp_path / "state",
        think_cap=cap,
        max_tokens=cap + 1024,  # the least the rule think_cap_leaves_answer_room accepts
    )
    report = await run_selftest(settings, tools_text=load_tools_spec(CORE_TOOLS_FILE).text)
    assert report.ok, [r for r in report.results if not r.ok]
    capped_before = METRICS.registry.get_sample_value("loopd_thinking_capped_total") or 0.0
    runtime = Runtime.open(settings, selftest={SHORTHAND_ENDPOINT: report.answers})
    answers = []
    try:
        session = runtime.ensure_session("capped")
        for number in range(3):
            text = f"Question {number}: think it through, then answer in a sentence."
            await runtime.append_user("capped", text, external_key=fresh_external_key())
            outcome = await runtime.run_turn(session, lambda status: None)
            assert outcome.failure is None, outcome.failure
            answers.append(outcome.answer)
        perfs = [r.record.perf for r in runtime.log.requests("capped")]
        problems = verify(runtime.log)
    finally:
        await runtime.aclose()
    capped_after = METRICS.registry.get_sample_value("loopd_thinking_capped_total") or 0.0
    assert all(answers), answers
    assert len(perfs) == 3, perfs
    for perf in perfs:
        assert perf.capped, perf
        assert perf.extra["control_answer"] == "success", perf
        assert perf.outcome == "complete", perf
        # Ended by the server, before loopd would close the stream as a runaway. How far past
        # the cap the answer was read is the control call's round trip (the model writes about
        # a token a ms, and two make test side by side slow the call more than the model): the
        # grace counts from there.
        answered_at = perf.extra["thinking_at_control_answer"]
        grace = Limits().think_grace
        assert cap <= answered_at <= (perf.thinking_tokens or 0) < answered_at + grace, perf
    assert capped_after - capped_before == 3
    assert problems == []
