"""Prewarm after a move (LOOPD_PREWARM, two fake endpoints): when a server dies, its idle sessions
move at once and their prompt is read on the new endpoint while it is idle; that read is the
move's one ``endpoint lost`` re-read, and the session's next turn there re-reads nothing."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from loopd.config import load_settings
from loopd.prewarm.prewarmer import PrewarmOutcome, PrewarmResult
from loopd.sessionlog.records import RequestKind, fresh_external_key
from loopd.sessionlog.verify import verify
from loopd.sessions import Runtime
from tests.endpoints.test_serving_fake import MODEL, two_fakes

pytestmark = pytest.mark.anyio


async def _turn(runtime: Runtime, name: str, text: str) -> None:
    session = runtime.ensure_session(name)
    runtime.log.append_user(name, f"{text} ({name})", external_key=fresh_external_key())
    outcome = await runtime.run_turn(session, lambda status: None)
    assert outcome.answer is not None, outcome.failure


def _requests(runtime: Runtime, name: str) -> list[tuple[str, object, str, int | None, str | None]]:
    return [
        (
            r.record.kind.value,
            r.record.perf.extra.get("endpoint"),
            r.record.perf.outcome,
            r.record.perf.cache_loss,
            r.record.perf.cache_loss_cause,
        )
        for r in runtime.log.requests(name)
    ]


async def test_a_dead_servers_idle_session_is_read_on_the_other_and_its_next_turn_is_warm(
    tmp_path: Path,
) -> None:
    async with two_fakes() as (folder, fakes):
        tables = [
            {"name": name, "url": f"unix:{folder}/{name}.sock", "model": MODEL, "slots": (0, 1)}
            for name in ("a", "b")
        ]
        settings = load_settings(
            endpoint=tables,
            state_dir=tmp_path,
            max_tokens=64,
            think_cap=0,
            prewarm=True,
            pin_slots="yes",  # the fake keeps idle slots' prompts; nothing is recorded for it
        )
        runtime = Runtime.open(settings)
        assert runtime.endpoints is not None
        warmed: list[tuple[str, PrewarmResult]] = []
        done = anyio.Event()

        def on_warmed(name: str, result: PrewarmResult) -> None:
            warmed.append((name, result))
            if result.outcome is PrewarmOutcome.DONE:
                done.set()

        runtime.endpoints.on_warmed(on_warmed)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(runtime.keep_warm, ["s1", "s2", "s3"])  # the front end's
                for name in ("s1", "s2", "s3"):
                    await _turn(runtime, name, "hello")
                assert {n: e for n, (e, _) in runtime.log.last_endpoints().items()} == {
                    "s1": "a",
                    "s2": "b",
                    "s3": "a",
                }
                await fakes["a"].kill()
                await _turn(runtime, "s1", "again")  # finds a dead: a is marked down
                with anyio.fail_after(30):
                    await done.wait()  # s3, idle, was moved and read on b
                await _turn(runtime, "s3", "again")
                await _turn(runtime, "s1", "and again")
                tg.cancel_scope.cancel()
            assert [(n, r.outcome) for n, r in warmed if r.outcome is PrewarmOutcome.DONE] == [
                ("s3", PrewarmOutcome.DONE)
            ]
            s3 = _requests(runtime, "s3")
            # The prewarm was the move's one re-read; the turn after it re-read nothing.
            assert s3[1][:3] == ("prewarm", "b", "complete")
            assert (s3[1][3] or 0) > 0
            assert s3[1][4] == "endpoint lost"
            assert s3[2] == ("turn", "b", "complete", 0, None)
            # s1 moved by its own turn: that turn's one re-read, and its next turn warm.
            s1 = [r for r in _requests(runtime, "s1") if r[2] == "complete"]
            assert [r[1:] for r in s1[1:]] == [
                ("b", "complete", s1[1][3], "endpoint lost"),
                ("b", "complete", 0, None),
            ]
            assert not [
                r for r in runtime.log.requests("s1") if r.record.kind is RequestKind.PREWARM
            ]
            assert verify(runtime.log) == []
        finally:
            await runtime.aclose()
