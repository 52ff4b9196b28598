"""Durable sessions where the server places requests (``id_slot`` -1, sessions not pinned):
more sessions than the server has slots take turns, with no host prompt cache to keep the ones
pushed out, so a session's return finds none of its prompt. loopd restores the state its last
turn saved into an idle slot of its own, sends the request naming that slot, and the request
reads only its new message; on the dense preset (SmolLM2, two slots) and on the hybrid one
(``qwen35moe``, four slots on a unified pool that clears idle slots). Model work is bounded by
``max_tokens``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from loopd.config import SHORTHAND_ENDPOINT, load_settings
from loopd.engine.cacheloss import LossCause
from loopd.engine.durable import DurableMode
from loopd.engine.outcome import Failure
from loopd.engine.pinning import PinSlots
from loopd.engine.request import ANY_SLOT
from loopd.selftest.expected import ServerAnswers
from loopd.sessions import Runtime
from loopd.turn.saves import SaveBook
from loopd_dev import devserver
from tests.durable.test_durable_real import Restartable, restartable, say, turn_request

pytestmark = [pytest.mark.real_server, pytest.mark.anyio]
__all__ = ["restartable"]  # the fixture, shared with the restart tests

# The server's slots per preset (devserver: SmolLM2 ``np 2``, the hybrid four on one pool).
SERVER_SLOTS = {devserver.PLAIN_MODEL: 2, devserver.HYBRID_MODEL: 4}
LOOPD_SLOTS = (0, 1)


def story(name: str) -> str:
    """A first message long enough that the shared head (system text, tools) is under half of
    the session's prompt, and unlike any other session's."""
    return f"{name}: " + " ".join(f"{name}-{i}" for i in range(150))


@pytest.mark.parametrize("model", list(SERVER_SLOTS))
async def test_a_placed_session_pushed_out_comes_back_from_disk_into_an_idle_slot(
    restartable: Callable[..., Restartable], tmp_path: Path, model: str
) -> None:
    server = restartable(model, layout=devserver.ServerLayout(cache_ram_mib=0))
    settings = load_settings(
        infer_url=server.url,
        model=model,
        state_dir=tmp_path / "state",
        slots=LOOPD_SLOTS,
        max_tokens=24,
        think_cap=0,  # the random hybrid model never ends its thinking on its own
        temperature=0.0,
        pin_slots=PinSlots.NO,
        durable=DurableMode.ON,
    )
    # One session more than the server has slots: the first is pushed out of every one.
    names = [f"s{i}" for i in range(SERVER_SLOTS[model] + 1)]
    # What ``loopd serve``'s self-test finds of it (the self-test's probe: tests/selftest).
    found = ServerAnswers(
        idle_slots_cleared=model == devserver.HYBRID_MODEL, durable_available=True
    )
    runtime = Runtime.open(settings, selftest={SHORTHAND_ENDPOINT: found})
    try:
        for name in names:
            await say(runtime, story(name), name)
        saved = SaveBook(settings.state_dir).latest(names[0])
        assert saved is not None, "the placed session's answered turn was saved"
        assert (server.saves / saved.file).is_file()
        back = await say(runtime, "Summarise in three words.", names[0])
    finally:
        await runtime.aclose()
    closed = back[0].record.perf
    assert closed.extra.get("failure") == Failure.LOST_BY_SERVER.value, closed
    answered = turn_request(back[1:]).record.perf
    restore = answered.extra["restore"]
    assert answered.cache_loss_cause == LossCause.RESTORED.value, restore
    assert restore["slot"] in LOOPD_SLOTS
    assert restore["slot"] != ANY_SLOT
    assert restore["n_restored"] == saved.n_saved
    assert answered.cache_n is not None
    assert answered.cache_n >= saved.n_saved - 4
    assert answered.prompt_n is not None
    assert answered.prompt_n < 40, "only the new message was read"
