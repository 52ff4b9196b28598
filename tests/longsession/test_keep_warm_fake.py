"""The prewarms the front ends run beside their turns (``Runtime.keep_warm``: the ``Warmer`` of
``loopd.endpoints.warm``), on the fake llama-server.

It prewarms a compacted session once another session has used its slot, and after a restart the
most recently active session of each slot; a real turn then reads only its own tokens.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from loopd.config import SHORTHAND_ENDPOINT, load_settings
from loopd.endpoints.server import Server
from loopd.endpoints.warm import Warmer
from loopd.engine.cacheloss import PrevRequest
from loopd.errors import LoopdError
from loopd.prewarm.prewarmer import PrewarmResult
from loopd.sessionlog.records import Request, RequestKind, Session, fresh_external_key
from loopd.sessionlog.verify import verify
from loopd.sessions import Runtime
from loopd_dev.fakes.llama import FakeLlama, ModelSpec
from tests.engine.engine_support import (
    MODEL,
    SLOT,
    Served,
    eventually,
    one_server,
    served,
    user_body,
)
from tests.longsession.longsession_support import words

pytestmark = pytest.mark.anyio


def _fake() -> FakeLlama:
    # No host prompt cache: another session's prompt on the slot really evicts a session's.
    return FakeLlama([ModelSpec(MODEL, n_slots=2, n_ctx=4096, host_cache_tokens=0)])


def _runtime(server: Served, state: Path, **overrides: Any) -> Runtime:
    values: dict[str, Any] = {
        "infer_url": server.url,
        "model": MODEL,
        "state_dir": state,
        "slots": (SLOT,),
        "max_tokens": 16,
        "think_cap": 0,
        "prewarm": True,
        # The fake keeps idle slots (no unified pool): the self-test would find them kept.
        "pin_slots": "yes",
        "compact_at": 0.5,
        "summary_max_tokens": 64,
    }
    values.update(overrides)
    return Runtime.open(load_settings(**values))


@asynccontextmanager
async def _keeping_warm(runtime: Runtime, restarted: list[str]) -> AsyncIterator[Warmer]:
    """What ``Runtime.keep_warm`` runs with LOOPD_PREWARM (with no endpoint down to re-check)."""
    warmer = Warmer(runtime.endpoints, restarted)
    async with anyio.create_task_group() as tg:
        tg.start_soon(warmer.run)
        yield warmer
        tg.cancel_scope.cancel()


async def _say(runtime: Runtime, name: str, text: str) -> None:
    session = runtime.ensure_session(name)
    await runtime.append_user(name, text, external_key=fresh_external_key())
    outcome = await runtime.run_turn(session, lambda status: None)
    assert outcome.failure is None, outcome.failure


def _settled(runtime: Runtime, warmer: Warmer) -> bool:
    """The warmer has decided about every idle slot: it takes a slot off its set before it
    decides, and a prewarm holds the slot from its first step. (Waiting for every task to block
    instead can spin for ever on a loaded machine while the fake server's tasks keep waking.)"""
    unseen = warmer.unseen[SHORTHAND_ENDPOINT]
    return not unseen and one_server(runtime).scheduler.holder(SLOT) is None


def _kinds(requests: list[Request]) -> list[RequestKind]:
    return [r.record.kind for r in requests]


def _prewarmed(runtime: Runtime, name: str) -> bool:
    requests = runtime.log.requests(name)
    return bool(requests) and requests[-1].record.kind is RequestKind.PREWARM


async def test_a_compacted_session_is_read_back_after_another_used_its_slot(
    tmp_path: Path,
) -> None:
    async with served(_fake()) as server:
        runtime = _runtime(server, tmp_path)
        try:
            async with _keeping_warm(runtime, []) as warmer:
                runtime.ensure_session("first")
                number = 0
                while len(runtime.log.epochs("first")) < 2:
                    await _say(runtime, "first", f"turn {number}: " + words(80, f"n{number}x"))
                    number += 1
                # The compacted session still holds the slot: nothing to read back yet.
                await eventually(lambda: _settled(runtime, warmer))
                assert not _prewarmed(runtime, "first")
                await _say(runtime, "other", "an unrelated question from another thread")
                await eventually(lambda: _prewarmed(runtime, "first"))
                await _say(runtime, "first", "and one more thing")
            first = runtime.log.requests("first")
            other = runtime.log.requests("other")
            problems = verify(runtime.log)
        finally:
            await runtime.aclose()
    assert RequestKind.COMPACTION in _kinds(first)
    assert RequestKind.PREWARM not in _kinds(other)
    prewarm, turn = (r.record for r in first[-2:])
    assert prewarm.kind is RequestKind.PREWARM
    assert prewarm.perf.outcome == "complete"
    assert (prewarm.perf.prompt_n or 0) > 100  # it re-read the new epoch
    assert turn.perf.cache_loss == 0, turn.perf
    assert turn.perf.prompt_n is not None
    assert turn.perf.prompt_n < 20, turn.perf  # the turn read only its own message
    assert problems == []


async def test_after_a_restart_the_latest_session_of_the_slot_is_read_back(
    tmp_path: Path,
) -> None:
    async with served(_fake()) as server:
        before = _runtime(server, tmp_path)
        try:
            await _say(before, "older", "the first thread's question")
            await _say(before, "latest", "the second thread's question")
            await _say(before, "older", "the first thread again, most recently")
        finally:
            await before.aclose()
        # Meanwhile another client took the slot (as a server restart would lose it).
        async with server.client.stream_chat(user_body("someone else's prompt")) as response:
            await response.aread()
        after = _runtime(server, tmp_path)
        try:
            async with _keeping_warm(after, ["older", "latest"]) as warmer:
                await eventually(lambda: _prewarmed(after, "older"))
                await eventually(lambda: _settled(after, warmer))
                await _say(after, "older", "and one more thing")
            older = after.log.requests("older")
            latest = after.log.requests("latest")
        finally:
            await after.aclose()
    assert RequestKind.PREWARM not in _kinds(latest)
    turn = older[-1].record
    assert turn.perf.cache_loss == 0, turn.perf
    assert (turn.perf.prompt_n or 0) < 20, turn.perf


async def test_with_prewarm_off_nothing_is_sent(tmp_path: Path) -> None:
    async with served(_fake()) as server:
        runtime = _runtime(server, tmp_path, prewarm=False)
        try:
            await _say(runtime, "older", "a question")
            with anyio.fail_after(1):
                await runtime.keep_warm(["older"])  # returns at once
            requests = runtime.log.requests("older")
        finally:
            await runtime.aclose()
    assert _kinds(requests) == [RequestKind.TURN]


async def test_a_prewarm_that_raises_is_logged_once_and_the_front_end_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[str] = []

    async def broken(
        server: Server, session: Session, slot: int, moved: PrevRequest | None = None
    ) -> PrewarmResult:
        calls.append(session.name)
        raise LoopdError("the log could not be read")

    async with served(_fake()) as server:
        before = _runtime(server, tmp_path)
        try:
            await _say(before, "older", "a question")
        finally:
            await before.aclose()
        runtime = _runtime(server, tmp_path)  # restarted: "older" is to be read back
        try:
            runtime.endpoints.prewarm = broken  # type: ignore[method-assign]
            async with _keeping_warm(runtime, ["older"]) as warmer:
                await eventually(lambda: calls == ["older"])
                # The slot falls idle again after another session's turn: no second attempt.
                await _say(runtime, "other", "another thread's question")
                await eventually(lambda: _settled(runtime, warmer))
        finally:
            await runtime.aclose()
    assert calls == ["older"]
    assert "prewarm of older on endpoint default failed; prewarm goes on" in caplog.text


async def test_without_prewarm_a_session_evicted_by_another_names_the_cause(
    tmp_path: Path,
) -> None:
    async with served(_fake()) as server:
        runtime = _runtime(server, tmp_path, prewarm=False)
        try:
            await _say(runtime, "first", "the first thread's question")
            await _say(runtime, "other", "another thread's question")
            await _say(runtime, "first", "the first thread again")
            await _say(runtime, "first", "and once more")
            first = runtime.log.requests("first")
        finally:
            await runtime.aclose()
    evicted, after = first[-2].record.perf, first[-1].record.perf
    assert evicted.cache_loss is not None
    assert evicted.cache_loss > 0
    assert evicted.cache_loss_cause == "another session used the slot"
    assert after.cache_loss == 0  # the slot holds the first session again
    assert after.cache_loss_cause is None
