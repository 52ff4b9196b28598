"""The repetition watch on a real model that loops: the tiny thinking preset, asked to sort three
words at temperature 0, thinks ``<tort_think_tort_tort>`` again and again until its cap. With the
watch, loopd ends that thought with the control call long before the cap; and when the answer
after it loops too, closes the answer and keeps it as written. A question it answers plainly
is left alone. ``python -m bench --think-loops`` measures a dozen such questions.

Bounded by tokens: a thinking cap of 1,024 and ``max_tokens`` 2,048, with the watch's window of
256 tokens.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from loopd.config import load_settings
from loopd.engine.outcome import TurnOutcome
from loopd.sessionlog.records import fresh_external_key
from loopd.sessions import Runtime
from loopd_dev import devserver

pytestmark = [pytest.mark.anyio, pytest.mark.real_server, pytest.mark.timeout(900)]

CAP = 1024


async def turn(server: devserver.RunningServer, state: Path, text: str) -> TurnOutcome:
    settings = load_settings(
        infer_url=server.url,
        model=devserver.THINKING_MODEL,
        state_dir=state,
        broker_url="unix:/nonexistent",
        temperature=0.0,
        max_tokens=2 * CAP,
        think_cap=CAP,
    )
    runtime = Runtime.open(settings)
    try:
        session = runtime.ensure_session("s")
        runtime.log.append_user("s", text, external_key=fresh_external_key())
        return await runtime.run_turn(session, lambda status: None)
    finally:
        await runtime.aclose()


async def test_a_looping_thought_on_the_real_model_is_ended_before_the_cap(
    real_server: devserver.RunningServer, tmp_path: Path
) -> None:
    outcome = await turn(real_server, tmp_path / "loops", "Sort these words: pear, apple, fig.")
    [request] = outcome.requests
    perf = request.perf
    print(f"thinking {perf.thinking_tokens} tokens, looped {perf.extra.get('looped')}: {outcome}")
    assert "reasoning" in perf.extra.get("looped", ())
    assert perf.extra.get("control_answer") == "success"
    assert (perf.thinking_tokens or 0) < CAP / 2
    assert outcome.notices[0].startswith("the model's thinking went round in circles")
    assert outcome.failure is None


async def test_a_plain_answer_on_the_real_model_is_left_alone(
    real_server: devserver.RunningServer, tmp_path: Path
) -> None:
    outcome = await turn(real_server, tmp_path / "calm", "What is the capital of Australia?")
    [request] = outcome.requests
    assert "looped" not in request.perf.extra
    assert (outcome.notices, outcome.failure) == ([], None)
