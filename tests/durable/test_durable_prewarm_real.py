"""A prewarm of a durable session restores its saved state instead of reading its prompt again
(``loopd.prewarm.prewarmer``): after the server is killed and started again, the prewarm on the
idle slot puts the save back and reads nothing, and the session's next turn then starts warm:
its first progress event finds the session held, so no request is closed to restore, and it
reads only its new message; on the dense and the hybrid preset, pinned and placed by the
server. Model work is bounded by ``max_tokens``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from loopd.engine.durable import DurableMode
from loopd.engine.pinning import PinSlots
from loopd.prewarm.prewarmer import PrewarmOutcome
from loopd.sessionlog.records import RequestKind
from loopd.turn.saves import SaveBook
from tests.durable.test_durable_real import (
    FIRST,
    PRESETS,
    SECOND,
    SESSION,
    Restartable,
    durable_settings,
    restartable,
    runtime_for,
    say,
    turn_request,
)

pytestmark = [pytest.mark.real_server, pytest.mark.anyio]
__all__ = ["restartable"]  # the fixture, shared with the restart tests


@pytest.mark.parametrize("pin_slots", [PinSlots.YES, PinSlots.NO])
@pytest.mark.parametrize("model", PRESETS)
async def test_a_prewarm_restores_the_saved_state_and_the_turn_starts_warm(
    restartable: Callable[..., Restartable], tmp_path: Path, model: str, pin_slots: PinSlots
) -> None:
    server = restartable(model)
    settings = durable_settings(server, tmp_path / "state", DurableMode.ON).model_copy(
        update={"prewarm": True, "pin_slots": pin_slots}
    )
    async with runtime_for(settings) as runtime:
        await say(runtime, FIRST)
        saved = SaveBook(settings.state_dir).latest(SESSION)
        assert saved is not None
        server.kill()
        server.start()
        warmed = await runtime.prewarm(runtime.ensure_session(SESSION))
        assert warmed.outcome is PrewarmOutcome.DONE, warmed.detail
        assert warmed.record is not None
        perf = warmed.record.perf
        restore = perf.extra["restore"]
        assert restore["n_restored"] == saved.n_saved, restore
        assert (perf.cache_n, perf.prompt_n) == (saved.n_saved, 0), "restored, nothing read"
        second = await say(runtime, SECOND)
    turns = [r for r in second if r.record.kind is RequestKind.TURN]
    assert len(turns) == 1, "no request was closed to restore: the server held the session"
    answered = turn_request(second).record.perf
    assert "restore" not in answered.extra
    assert answered.cache_loss == 0, answered
    assert answered.cache_n is not None
    assert answered.cache_n >= saved.n_saved - 4
    assert answered.prompt_n is not None
    assert answered.prompt_n < 40, "only the new message was read"
