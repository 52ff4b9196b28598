"""The quiet rule's facts on the real router (``loopd.engine.quiet``), sent by loopd's own
client: a model whose child sleeps after two idle seconds answers each request of
``ANSWERED_ASLEEP`` asleep, and those requests do not keep it awake; every other request wakes
it; and an unloaded model stays unloaded for every request a background check makes. A new
request kind must be added to ``SENDERS`` (and so measured here) before loopd may make it."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator

import anyio
import pytest

from loopcommon.jsonbytes import dumps
from loopd.engine.client import InferenceClient
from loopd.engine.durable import probe_name
from loopd.engine.modelstate import ModelStatus
from loopd.engine.quiet import ANSWERED_ASLEEP, Call, Purpose
from loopd.errors import InferenceError, ServerRejected
from loopd_dev import devserver
from tests.durable.sleepy import CHANGE_WITHIN_S, sleepy_router, status_becomes

pytestmark = [pytest.mark.real_server, pytest.mark.anyio]

MODEL = devserver.PLAIN_MODEL
SLEEP_S = 2
BODY = dumps(
    {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Say OK."}],
        "max_tokens": 1,
        "stream": True,
        "id_slot": 0,
    }
).encode()


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[devserver.RunningServer]:
    with sleepy_router(tmp_path_factory.mktemp("quiet"), MODEL, SLEEP_S) as server:
        yield server


async def _chat(client: InferenceClient) -> None:
    async with client.stream_chat(BODY) as answer:
        await answer.aread()


async def _rejected_or_answered(call: Awaitable[object]) -> None:
    """Wait for the server's answer, whatever it is (a refusal is an answer too)."""
    with contextlib.suppress(ServerRejected):
        await call


SENDERS: dict[Call, Callable[[InferenceClient], Awaitable[object]]] = {
    Call.HEALTH: lambda c: c.health(),
    Call.PROPS: lambda c: c.props(purpose=Purpose.CHECK),
    Call.MODELS: lambda c: c.models(),
    Call.SLOTS: lambda c: c.slots(wait_s=CHANGE_WITHIN_S),
    Call.CHAT: _chat,
    Call.CONTROL: lambda c: _rejected_or_answered(c.control_reasoning_end("chatcmpl-none")),
    Call.SLOT_SAVE: lambda c: c.save_slot(0, probe_name(MODEL)),
    Call.SLOT_RESTORE: lambda c: _rejected_or_answered(c.restore_slot(1, "loopd-absent.bin")),
    Call.APPLY_TEMPLATE: lambda c: c.post_json(
        "/apply-template",
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
        CHANGE_WITHIN_S,
    ),
    Call.TOKENIZE: lambda c: c.post_json(
        "/tokenize", {"model": MODEL, "content": "hi"}, CHANGE_WITHIN_S
    ),
}


def test_every_call_is_measured_here() -> None:
    assert set(SENDERS) == set(Call)


@pytest.mark.parametrize("call", list(Call))
async def test_a_sleeping_model_answers_asleep_only_what_the_rule_says(
    router: devserver.RunningServer, call: Call
) -> None:
    async with InferenceClient(router.url, MODEL) as client:
        await status_becomes(client, ModelStatus.ASLEEP)
        await SENDERS[call](client)
        reading = await client.model_reading()
    woke = call not in ANSWERED_ASLEEP
    assert reading.status is (ModelStatus.AWAKE if woke else ModelStatus.ASLEEP)


async def test_asking_what_is_answered_asleep_does_not_keep_it_awake(
    router: devserver.RunningServer,
) -> None:
    async with InferenceClient(router.url, MODEL) as client:
        await _chat(client)  # awake, its idle time starting now
        started = time.monotonic()
        while (reading := await client.model_reading()).status is not ModelStatus.ASLEEP:
            for call in sorted(ANSWERED_ASLEEP):
                await SENDERS[call](client)
            assert time.monotonic() - started < SLEEP_S + CHANGE_WITHIN_S, reading
            await anyio.sleep(0.2)  # five rounds of asking a second: far more than loopd asks
    assert reading.sleep_idle_s == SLEEP_S


async def test_an_unloaded_model_stays_unloaded_for_a_background_check(
    router: devserver.RunningServer,
) -> None:
    with router.client() as raw:
        assert raw.post("/models/unload", json={"model": MODEL}).status_code == 200
    async with InferenceClient(router.url, MODEL) as client:
        await status_becomes(client, ModelStatus.UNLOADED)
        await client.health()
        await client.models()
        with pytest.raises(ServerRejected, match="model is not loaded"):
            await client.props(purpose=Purpose.CHECK)
        with pytest.raises(ServerRejected, match="model is not loaded"):
            await client.slots()
        assert (await client.model_reading()).status is ModelStatus.UNLOADED
        # A person's request loads it again, as any client's would.
        await client.props(CHANGE_WITHIN_S, purpose=Purpose.PERSON)
        await status_becomes(client, ModelStatus.AWAKE)


async def test_the_reading_holds_what_the_server_reports_of_the_weights(
    router: devserver.RunningServer,
) -> None:
    async with InferenceClient(router.url, MODEL) as client:
        await status_becomes(client, ModelStatus.ASLEEP)
        asleep = await client.model_reading()
        try:
            await _chat(client)
        except InferenceError as exc:
            pytest.fail(f"a person's request could not wake the model: {exc}")
        awake = await client.model_reading()
    assert asleep.weights is not None
    assert asleep.weights.file == devserver.MODEL_FILE
    assert asleep.weights.n_params is not None
    # A sleep keeps the process: the same start, the same fingerprint.
    assert awake.instance == asleep.instance
    assert awake.fingerprint(MODEL) == asleep.fingerprint(MODEL) is not None
