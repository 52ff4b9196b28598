"""A reply cut at ``max_tokens`` whose text reads back as fewer tokens than the model generated:
the next request keeps only the previous prompt, and the cache-loss rule names the cause
(``LossCause.REPLY_TRIMMED``) instead of ``unexplained``. On SmolLM2 with the every-turn
reasoning template the model's first token after ``<think>`` is a newline that the server's
reasoning parser trims from ``reasoning_content``, so the stored reply renders otherwise from
its first token. Model work is bounded by ``max_tokens``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from loopd.engine.cacheloss import CHECKPOINT_BEFORE_END, LossCause, PrevRequest, cache_loss
from loopd.engine.durable import DurableMode
from loopd_dev import devserver
from tests.durable import test_durable_real as real
from tests.durable.test_durable_real import Restartable, restartable

__all__ = ["restartable"]  # the fixture, shared with the restart tests

CUT = PrevRequest(1, 0, cache_n=0, prompt_n=400, predicted_n=64, complete=True, capped=False,
                  had_reasoning=True, reply_short=1)  # fmt: skip


def test_a_trimmed_cut_reply_names_the_loss_of_the_reply() -> None:
    loss = cache_loss(CUT, epoch_id=1, slot=0, cache_n=400)
    assert (loss.lost, loss.cause) == (63, LossCause.REPLY_TRIMMED)
    # A hybrid model resumes at its checkpoint before the prompt's end: still the reply's loss.
    at_checkpoint = cache_loss(CUT, epoch_id=1, slot=0, cache_n=400 - CHECKPOINT_BEFORE_END)
    assert at_checkpoint.cause is LossCause.REPLY_TRIMMED


def test_a_loss_inside_the_prompt_is_not_the_reply_s() -> None:
    assert cache_loss(CUT, epoch_id=1, slot=0, cache_n=200).cause is LossCause.UNEXPLAINED
    whole = PrevRequest(1, 0, 0, 400, 64, complete=True, capped=False, had_reasoning=True)
    assert cache_loss(whole, epoch_id=1, slot=0, cache_n=400).cause is LossCause.UNEXPLAINED


@pytest.mark.real_server
@pytest.mark.anyio
async def test_the_request_after_a_trimmed_cut_reply_names_the_cause(
    restartable: Callable[..., Restartable], tmp_path: Path
) -> None:
    server = restartable(devserver.EVERY_TURN_MODEL)
    settings = real.durable_settings(server, tmp_path / "state", DurableMode.OFF).model_copy(
        update={"max_tokens": 64}
    )
    async with real.runtime_for(settings) as runtime:
        cut = real.turn_request(await real.say(runtime, "Write a long story about a dragon."))
        after = real.turn_request(await real.say(runtime, "Go on with the story."))
    first, second = cut.record, after.record
    assert first.perf.extra.get("finish_reason") == "length"
    short = first.perf.extra.get("reply_short")
    assert isinstance(short, int), first.perf.extra
    assert short >= 1
    assert second.perf.cache_loss_cause == LossCause.REPLY_TRIMMED.value, second.perf
    # Its prompt was kept whole; what it lost is the reply.
    assert first.perf.cache_n is not None
    assert first.perf.prompt_n is not None
    assert second.perf.cache_n == first.perf.cache_n + first.perf.prompt_n
