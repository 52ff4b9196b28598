"""Durable sessions on the real server (``loopd.engine.durable``): a session's slot saved at the
end of its turn comes back after the server is killed and started again, on the dense preset
(SmolLM2) and on the hybrid one (``qwen35moe``: a recurrent state beside the attention layers);
after a restore, greedy generation gives the same tokens as after a full re-read; and a save
the server never answered is never restored. Model work is bounded by ``max_tokens``."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Protocol

import pytest

from loopcommon.jsonbytes import dumps
from loopd.config import SHORTHAND_ENDPOINT, Settings, load_settings
from loopd.engine.cacheloss import LossCause
from loopd.engine.durable import DurableMode, save_name
from loopd.engine.limits import Limits
from loopd.engine.pinning import PinSlots
from loopd.engine.request import build_body
from loopd.engine.stream import run_request
from loopd.selftest.expected import ServerAnswers
from loopd.sessionlog.records import Request, RequestKind, fresh_external_key
from loopd.sessions import Runtime
from loopd.turn.saves import DurableSlots, SaveBook
from loopd_dev import devserver
from tests.engine.engine_support import one_server

pytestmark = [pytest.mark.real_server, pytest.mark.anyio]

SESSION = "north"
FIRST = "Message one: tell me about the weather in a few words."
SECOND = "Message two: and tomorrow?"


class Restartable:
    """A router with a slot-save folder, killed and started again on the same socket."""

    def __init__(
        self,
        workdir: Path,
        model: str,
        extra: tuple[str, ...] = (),
        layout: devserver.ServerLayout | None = None,
    ) -> None:
        self.workdir = workdir
        self.model = model
        self.extra = extra
        self.layout = layout
        self.saves = workdir / "saves"
        self.saves.mkdir(parents=True, exist_ok=True)
        self.server: devserver.RunningServer | None = None

    @property
    def url(self) -> str:
        return f"unix:{self.workdir / 'llama.sock'}"

    def start(self) -> None:
        try:
            self.server = devserver.start(
                self.workdir,
                devserver.default_cache_dir(),
                socket_path=self.workdir / "llama.sock",
                extra_args=("--slot-save-path", f"{self.saves}/", *self.extra),
                layout=self.layout,
                load=(self.model,),
            )
        except devserver.DevServerError as exc:
            pytest.fail(f"the real llama-server is required and could not start: {exc}")

    def kill(self) -> None:
        assert self.server is not None
        self.server.kill()
        self.server = None

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None


@pytest.fixture
def restartable(tmp_path: Path) -> Iterator[Callable[..., Restartable]]:
    made: list[Restartable] = []

    def make(model: str, *extra: str, layout: devserver.ServerLayout | None = None) -> Restartable:
        server = Restartable(tmp_path / "server", model, extra, layout)
        made.append(server)
        server.start()
        return server

    try:
        yield make
    finally:
        for server in made:
            server.stop()


class Served(Protocol):
    """A server a test started: where it listens and the model it serves."""

    @property
    def url(self) -> str: ...

    model: str


def durable_settings(server: Served, state: Path, durable: DurableMode) -> Settings:
    return load_settings(
        infer_url=server.url,
        model=server.model,
        state_dir=state,
        slots=(0,),
        max_tokens=24,
        think_cap=0,  # the random hybrid model never ends its thinking on its own
        temperature=0.0,
        pin_slots=PinSlots.YES,
        durable=durable,
    )


@asynccontextmanager
async def runtime_for(settings: Settings) -> AsyncIterator[Runtime]:
    # What ``loopd serve``'s self-test finds of it (the self-test's probe: tests/selftest).
    found = ServerAnswers(idle_slots_cleared=False, durable_available=True)
    runtime = Runtime.open(settings, selftest={SHORTHAND_ENDPOINT: found})
    try:
        yield runtime
    finally:
        await runtime.aclose()


async def say(runtime: Runtime, text: str, name: str = SESSION) -> list[Request]:
    """One turn of session ``name``; the requests it added to the log."""
    session = runtime.ensure_session(name)
    before = len(runtime.log.requests(name))
    await runtime.append_user(name, text, external_key=fresh_external_key())
    outcome = await runtime.run_turn(session, lambda status: None)
    assert outcome.failure is None, outcome.failure
    return runtime.log.requests(name)[before:]


PRESETS = [devserver.PLAIN_MODEL, devserver.HYBRID_MODEL]


def turn_request(requests: list[Request]) -> Request:
    """The turn's request that was answered (a prefix read for the save comes after it)."""
    return next(
        r
        for r in requests
        if r.record.kind is RequestKind.TURN and r.record.perf.outcome == "complete"
    )


@pytest.mark.parametrize("model", PRESETS)
async def test_a_session_comes_back_warm_after_the_server_is_killed(
    restartable: Callable[..., Restartable], tmp_path: Path, model: str
) -> None:
    server = restartable(model)
    settings = durable_settings(server, tmp_path / "state", DurableMode.ON)
    async with runtime_for(settings) as runtime:
        first = await say(runtime, FIRST)
        saved = SaveBook(settings.state_dir).latest(SESSION)
        assert saved is not None, "the answered turn was saved"
        assert (server.saves / saved.file).is_file()
        server.kill()
        server.start()
        second = await say(runtime, SECOND)
    assert [r.record.kind for r in first] == [RequestKind.TURN, RequestKind.PREWARM]
    # The turn read the model first (its process is new: it restarted), restored the save and
    # sent its request once.
    assert [r.record.kind for r in second] == [RequestKind.TURN, RequestKind.PREWARM]
    answered = turn_request(second).record.perf
    restore = answered.extra["restore"]
    assert restore["why"] == "the model restarted"
    assert answered.cache_loss_cause == LossCause.RESTORED.value, restore
    assert restore["n_restored"] == saved.n_saved
    # Everything the first turn left is reused; only the new message is read (loopd/ideal).
    assert answered.cache_n == saved.n_saved
    assert answered.prompt_n is not None
    assert answered.prompt_n <= (answered.cache_n + answered.prompt_n - saved.n_saved) * 1.02 + 1


@pytest.mark.parametrize("model", PRESETS)
async def test_greedy_generation_after_a_restore_equals_a_full_re_read(
    restartable: Callable[..., Restartable], tmp_path: Path, model: str
) -> None:
    # One token per batch, so that a prompt read and a generated reply compute the same numbers
    # (a batch of many tokens takes other kernels, whose rounding can turn a greedy choice):
    # a difference can then come only from the restore.
    server = restartable(model, "--ubatch-size", "1")
    settings = durable_settings(server, tmp_path / "state", DurableMode.ON)
    async with runtime_for(settings) as runtime:
        await say(runtime, FIRST)
        server.kill()
        server.start()
        second = turn_request(await say(runtime, SECOND))
        assert second.record.perf.cache_loss_cause == LossCause.RESTORED.value
        restored_reply = runtime.log.replay_messages(SESSION)[second.record.message_count]
        # The same request on a server that holds nothing and restores nothing: a full re-read.
        messages = runtime.log.replay_messages(SESSION)[: second.record.message_count]
        tools_text = runtime.log.current_epoch(SESSION).tools_text
        request_settings = runtime.turn(runtime.ensure_session(SESSION), lambda s: None).settings
        server.kill()
        server.start()
        limits = Limits(first_byte_s=60.0, silence_s=60.0)
        body = build_body(request_settings, tools_text, messages)
        reread = await run_request(one_server(runtime).client, body, slot=0, limits=limits)
    assert reread.complete, reread.detail
    timings = reread.assembler.timings
    assert timings is not None
    assert timings.cache_n == 0, "the second server read everything"
    assert dumps(reread.assembler.message().to_wire()) == restored_reply


async def test_a_session_evicted_by_another_on_its_slot_comes_back_from_disk(
    restartable: Callable[..., Restartable], tmp_path: Path
) -> None:
    """Two sessions take turns on one slot and the server has no host prompt cache: each
    return finds the slot holding the other's prompt, and restores its own state instead of
    reading it again, before its request (the log says the other session ran there), which is
    sent once."""
    server = restartable(devserver.PLAIN_MODEL, layout=devserver.ServerLayout(cache_ram_mib=0))
    settings = durable_settings(server, tmp_path / "state", DurableMode.ON)
    # Long enough that the shared head (system text and tools) is under half of each prompt.
    story = {name: f"{name}: " + " ".join(f"{name}-{i}" for i in range(150)) for name in "AB"}
    async with runtime_for(settings) as runtime:
        for name in "AB":
            await say(runtime, story[name], name)
        back = await say(runtime, "Summarise in three words.", "A")
    assert [r.record.kind for r in back] == [RequestKind.TURN, RequestKind.PREWARM]
    answered = turn_request(back).record.perf
    assert answered.cache_loss_cause == LossCause.RESTORED.value, answered
    assert answered.extra["restore"]["why"] == LossCause.SHARED_SLOT.value
    assert answered.prompt_n is not None
    assert answered.prompt_n < 40, "only the new message was read"


async def test_a_save_the_server_did_not_answer_is_never_restored(
    restartable: Callable[..., Restartable], tmp_path: Path
) -> None:
    """The save fails on the server (its file cannot be written: a directory is in the way, as
    a full disk or a kill mid-write leaves no answer of success), and what such a save left
    behind (here a cut copy of a real state under the session's name) is never read back: loopd
    restores only what it recorded after the server's success answer."""
    server = restartable(devserver.PLAIN_MODEL)
    off = durable_settings(server, tmp_path / "state", DurableMode.OFF)
    async with runtime_for(off) as runtime:
        await say(runtime, FIRST)
        session = runtime.ensure_session(SESSION)
        messages = runtime.log.replay_messages(SESSION)
        tools_text = runtime.log.current_epoch(SESSION).tools_text
        book = SaveBook(off.state_dir)
        one = one_server(runtime)
        durable = DurableSlots(one.client, book, one.prewarmer)
        fingerprint = (await durable.look()).fingerprint(one.client.model)
        assert fingerprint is not None
        name = save_name(SESSION, tools_text, messages, fingerprint)
        (server.saves / name).mkdir()
        request_settings = runtime.turn(session, lambda s: None).settings
        assert await durable.save(session, request_settings, tools_text, messages) is None
        assert book.latest(SESSION) is None
        # A real state, cut in half, where the failed save would have written it.
        whole = await one.client.save_slot(0, "loopd-0000000000000000-" + "0" * 32 + ".bin")
        assert whole.n_tokens > 0
        (server.saves / name).rmdir()
        cut = (server.saves / ("loopd-0000000000000000-" + "0" * 32 + ".bin")).read_bytes()
        (server.saves / name).write_bytes(cut[: len(cut) // 2])
    server.kill()
    server.start()
    on = durable_settings(server, tmp_path / "state", DurableMode.ON)
    async with runtime_for(on) as runtime:
        second = await say(runtime, SECOND)
    answered = turn_request(second).record.perf
    assert [
        r.record.perf.extra.get("failure") for r in second if r.record.kind is RequestKind.TURN
    ] == [None]
    assert "restore" not in answered.extra
    assert answered.cache_loss_cause == LossCause.SERVER_RESTARTED.value
