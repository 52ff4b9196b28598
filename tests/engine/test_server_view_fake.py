"""What the engine is told about the server reaches its turns: the self-test's template verdict
feeds the cache-loss rule (``loopd serve`` passes it on)."""

from __future__ import annotations

from pathlib import Path

import pytest

from loopd.config import Settings, load_settings
from loopd.engine.cacheloss import LossCause
from loopd.selftest.run import run_selftest
from loopd.selftest.template import TemplateAnswer
from loopd.serve import startup_answers
from loopd.sessionlog.records import fresh_external_key
from loopd.sessions import Runtime
from loopd_dev.fakes.llama import FakeLlama, ModelSpec, TemplateOptions
from tests.engine.engine_support import MODEL, served

pytestmark = pytest.mark.anyio


def _dropping() -> FakeLlama:
    return FakeLlama([ModelSpec(MODEL, template=TemplateOptions(drop_past_reasoning=True))])


def _settings(url: str, state: Path) -> Settings:
    return load_settings(infer_url=url, model=MODEL, state_dir=state, max_tokens=2048, think_cap=0)


async def _two_turns(runtime: Runtime) -> list[str | None]:
    session = runtime.ensure_session("s")
    for text in ("hello there", "and again"):
        await runtime.append_user("s", text, external_key=fresh_external_key())
        outcome = await runtime.run_turn(session, lambda status: None)
        assert outcome.failure is None, outcome.failure
    return [r.record.perf.cache_loss_cause for r in runtime.log.requests("s")]


async def test_serve_passes_the_self_tests_template_verdict_to_the_turns(tmp_path: Path) -> None:
    async with served(_dropping()) as server:
        settings = _settings(server.url, tmp_path / "state")
        report = await run_selftest(settings, record=True, expected_dir=tmp_path / "expected")
        assert report.ok
        assert report.keeps_past_reasoning is TemplateAnswer.NO
        # What ``loopd serve`` builds its runtime with (``serve.startup_answers``).
        answers = startup_answers(report, None)
        runtime = Runtime.open(settings, selftest=answers, expected_dir=tmp_path / "expected")
        try:
            causes = await _two_turns(runtime)
        finally:
            await runtime.aclose()
    assert causes == [LossCause.FIRST, LossCause.TEMPLATE_DROPS_REASONING]
