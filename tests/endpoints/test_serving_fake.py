"""Turns across two endpoints on the fake llama-server: where a session's turn runs, the move of
a dead server's sessions (one ``endpoint lost`` each), and a turn with no endpoint up."""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import pytest
from anyio.abc import TaskStatus

from loopd.config import load_settings
from loopd.engine.progress import Phase, Status
from loopd.sessionlog.records import fresh_external_key
from loopd.sessionlog.verify import verify
from loopd.sessions import Runtime
from loopd_dev.fakes.llama import FakeLlama, RunningFake, Trigger, serve_fake_llama

pytestmark = pytest.mark.anyio

MODEL = "fake-model"


@dataclass
class Fake:
    """A fake llama-server served in a task of its own; ``kill`` ends it (its server dies)."""

    llama: FakeLlama
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    gone: anyio.Event = field(default_factory=anyio.Event)
    running: RunningFake | None = None

    async def kill(self) -> None:
        assert self.running is not None
        self.running.kill()  # every connection closed and every request dropped, at once
        self.scope.cancel()
        await self.gone.wait()  # its socket is closed


async def _serve(socket: Path, *, task_status: TaskStatus[Fake]) -> None:
    fake = Fake(FakeLlama())
    try:
        with fake.scope:
            async with serve_fake_llama(fake.llama, uds=socket) as running:
                fake.running = running
                task_status.started(fake)
                await anyio.sleep_forever()
    finally:
        fake.gone.set()


@asynccontextmanager
async def two_fakes() -> AsyncIterator[tuple[Path, dict[str, Fake]]]:
    """Fakes ``a`` and ``b`` on Unix sockets in a short folder of their own."""
    with tempfile.TemporaryDirectory(prefix="lsf") as tmp:
        async with anyio.create_task_group() as tg:
            fakes = {name: await tg.start(_serve, Path(tmp) / f"{name}.sock") for name in "ab"}
            yield Path(tmp), fakes
            tg.cancel_scope.cancel()


def _runtime(folder: Path, state: Path) -> Runtime:
    tables = [
        {"name": name, "url": f"unix:{folder}/{name}.sock", "model": MODEL, "slots": (0, 1)}
        for name in ("a", "b")
    ]
    # Pinned: the fake keeps idle slots' prompts, and no expectations are recorded for its model.
    settings = load_settings(
        endpoint=tables, state_dir=state, max_tokens=64, think_cap=0, pin_slots="yes"
    )
    return Runtime.open(settings)


async def _turn(runtime: Runtime, name: str, text: str) -> str | None:
    session = runtime.ensure_session(name)
    runtime.log.append_user(name, text, external_key=fresh_external_key())
    outcome = await runtime.run_turn(session, lambda status: None)
    return outcome.answer if outcome.answer is not None else f"failed: {outcome.failure}"


def _endpoints(runtime: Runtime, name: str) -> list[tuple[object, str, str | None]]:
    return [
        (r.record.perf.extra.get("endpoint"), r.record.perf.outcome, r.record.perf.cache_loss_cause)
        for r in runtime.log.requests(name)
    ]


async def test_a_dead_servers_sessions_move_once_and_with_none_up_the_turn_says_so(
    tmp_path: Path,
) -> None:
    async with two_fakes() as (folder, fakes):
        runtime = _runtime(folder, tmp_path)
        try:
            for name in ("s1", "s2", "s3"):
                assert not (await _turn(runtime, name, f"hello {name}") or "").startswith("failed")
            placed = {name: where for name, (where, _) in runtime.log.last_endpoints().items()}
            assert placed == {"s1": "a", "s2": "b", "s3": "a"}

            await fakes["a"].kill()  # a's server is gone: nothing answers at its socket
            assert not (await _turn(runtime, "s1", "again") or "").startswith("failed")
            assert not (await _turn(runtime, "s3", "again") or "").startswith("failed")
            assert not (await _turn(runtime, "s1", "and again") or "").startswith("failed")
            s1 = _endpoints(runtime, "s1")
            assert [r for r in s1 if r[1] != "complete"] == [("a", "broken", None)] * 3
            assert [r for r in s1 if r[1] == "complete"][1:] == [
                ("b", "complete", "endpoint lost"),
                ("b", "complete", None),
            ]
            assert _endpoints(runtime, "s3")[1:] == [("b", "complete", "endpoint lost")]
            assert verify(runtime.log) == []

            await fakes["b"].kill()
            assert await _turn(runtime, "s2", "anyone?") == "failed: no endpoint is up (a, b)"
        finally:
            await runtime.aclose()


async def test_a_cut_stream_from_a_server_still_answering_moves_nothing(tmp_path: Path) -> None:
    async with two_fakes() as (folder, fakes):
        runtime = _runtime(folder, tmp_path)
        try:
            assert not (await _turn(runtime, "s1", "hello") or "").startswith("failed")
            fakes["a"].llama.faults.set(drop_mid_stream=Trigger(after=2))
            cut = await _turn(runtime, "s1", "again")
            assert cut is not None
            assert cut.startswith("failed"), cut
            assert runtime.endpoints is not None
            assert runtime.endpoints.fleet.health.is_up("a")  # busy or flaky, not dead
            fakes["a"].llama.faults.clear()
            assert not (await _turn(runtime, "s1", "once more") or "").startswith("failed")
            where = {r[0] for r in _endpoints(runtime, "s1")}
            causes = {r[2] for r in _endpoints(runtime, "s1")}
            assert where == {"a"}
            assert "endpoint lost" not in causes
        finally:
            await runtime.aclose()


async def test_a_server_killed_mid_stream_the_turn_answers_on_the_other(tmp_path: Path) -> None:
    async with two_fakes() as (folder, fakes):
        runtime = _runtime(folder, tmp_path)
        try:
            assert not (await _turn(runtime, "s1", "hello") or "").startswith("failed")
            fakes["a"].llama.faults.set(stall_mid_stream=Trigger(after=1))
            streaming = anyio.Event()

            def report(status: Status) -> None:
                if status.phase not in (Phase.WAITING, Phase.QUEUED):  # a data event came
                    streaming.set()

            session = runtime.ensure_session("s1")
            runtime.log.append_user("s1", "a long story", external_key=fresh_external_key())
            answers: list[str | None] = []

            async def turn() -> None:
                answers.append((await runtime.run_turn(session, report)).answer)

            with anyio.fail_after(30):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(turn)
                    await streaming.wait()  # a's stream has begun, and stalls after its first event
                    await fakes["a"].kill()
            assert answers[0] is not None
            s1 = _endpoints(runtime, "s1")
            # The cut stream, and the attempts that found nothing answering, are broken on a;
            # the turn answered on b, with the one re-read recorded.
            assert {r[:2] for r in s1[1:-1]} == {("a", "broken")}
            assert s1[-1] == ("b", "complete", "endpoint lost")
            assert verify(runtime.log) == []
        finally:
            await runtime.aclose()
