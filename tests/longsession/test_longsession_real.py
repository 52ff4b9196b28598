"""Issue acceptance on the real llama-server (4,096 tokens per slot): a 40-turn session compacts
before the context runs out, a 10,000-token message is cut instead of failing, and a prewarmed
session's next turn reads only its own tokens."""

from __future__ import annotations

import tempfile
from pathlib import Path

import anyio
import pytest

from loopd.config import load_settings
from loopd.prewarm.prewarmer import PrewarmOutcome, PrewarmResult
from loopd.sessionlog.records import Request, RequestKind, fresh_external_key
from loopd.sessionlog.verify import verify
from loopd.sessions import Runtime
from loopd_dev import devserver
from tests.engine.engine_support import eventually, one_server

pytestmark = pytest.mark.real_server

N_CTX = 4096  # the devserver's default layout: ctx 8192 over 2 slots
TOPICS = [
    "the garden",
    "a bicycle",
    "the harbour",
    "an old clock",
    "the library",
    "a mountain road",
    "the kitchen",
    "a winter market",
]


def _message(number: int) -> str:
    """About 150 tokens of plain English, different every turn."""
    topic = TOPICS[number % len(TOPICS)]
    sentence = (
        f"This is message {number}, about {topic}. I walked past {topic} this morning and "
        f"noticed how the light changed over the hours, how people stopped to look, and how "
        f"the sounds of the street mixed with the wind. "
    )
    return sentence * 3 + "Please answer with one short sentence."


def _runtime(real_server: devserver.RunningServer, tmp_path: Path, **extra: object) -> Runtime:
    settings = load_settings(
        infer_url=real_server.url,
        model=devserver.PLAIN_MODEL,
        state_dir=tmp_path,
        slots=(0,),
        temperature=0.0,
        max_tokens=24,
        think_cap=0,  # no cap: 24 tokens leave a capped reasoning no room to answer
        **extra,
    )
    return Runtime.open(settings)


def _full_read_once(requests: list[Request], index: int) -> None:
    """A compaction extends the cached prompt, the new epoch is read once, then reused."""
    compaction, first, second = (r.record for r in requests[index : index + 3])
    assert compaction.perf.outcome == "complete", compaction.perf
    assert compaction.perf.cache_loss == 0, compaction.perf
    assert first.epoch == compaction.epoch + 1
    assert first.perf.cache_loss_cause == "new epoch", first.perf
    assert second.perf.cache_loss == 0, second.perf
    assert second.perf.prompt_n is not None
    assert second.perf.prompt_n < 300, second.perf  # only the new message


# About 6,000 prompt tokens and 1,500 generated ones: two minutes on an idle 2-core machine; the
# per-test limit is raised for a busy one.
@pytest.mark.timeout(900)
@pytest.mark.anyio
async def test_forty_turns_compact_before_the_context_runs_out(
    real_server: devserver.RunningServer, tmp_path: Path
) -> None:
    runtime = _runtime(real_server, tmp_path, summary_max_tokens=64)  # the tiny model rambles
    notices: list[str] = []
    try:
        session = runtime.ensure_session("long")
        for number in range(40):
            await runtime.append_user("long", _message(number), external_key=fresh_external_key())
            outcome = await runtime.run_turn(session, lambda status: None)
            assert outcome.failure is None, (number, outcome.failure)
            notices += outcome.notices
        requests = runtime.log.requests("long")
        epochs = runtime.log.epochs("long")
        problems = verify(runtime.log)
    finally:
        await runtime.aclose()
    assert problems == []
    assert len(epochs) >= 3, [e.reason for e in epochs]
    compactions = [i for i, r in enumerate(requests) if r.record.kind is RequestKind.COMPACTION]
    assert len(compactions) == len(epochs) - 1 == len(notices)
    for index in compactions[:-1]:
        _full_read_once(requests, index)
    for request in requests:
        perf = request.record.perf
        assert perf.outcome == "complete", perf
        assert "status_code" not in perf.extra
        assert (perf.cache_n or 0) + (perf.prompt_n or 0) < N_CTX


@pytest.mark.anyio
async def test_a_ten_thousand_token_message_is_cut_with_a_note(
    real_server: devserver.RunningServer, tmp_path: Path
) -> None:
    runtime = _runtime(real_server, tmp_path)
    try:
        session = runtime.ensure_session("huge")
        text = "The quick brown fox jumps over the lazy dog. " * 1000
        assert await one_server(runtime).budget.count_text(text) >= 10_000
        key = fresh_external_key()
        taken = await runtime.append_user("huge", text, external_key=key)
        stored = taken.appended.entry.message or ""
        outcome = await runtime.run_turn(session, lambda status: None)
        (request,) = runtime.log.requests("huge")
    finally:
        await runtime.aclose()
    assert "[loopd: this message was cut here. It was 1" in stored
    # Never cut silently: the whole message is in the workspace, and its author is told.
    kept = f"messages/{key}.txt"
    assert f"in the file {kept} of the workspace" in stored
    assert (tmp_path / "workspaces" / "huge" / kept).read_text() == text
    assert taken.notice is not None
    assert f"kept in its workspace as {kept}" in taken.notice
    assert outcome.failure is None
    assert request.record.perf.outcome == "complete"
    assert (request.record.perf.prompt_n or 0) < N_CTX // 2


@pytest.mark.timeout(900)
@pytest.mark.anyio
async def test_after_a_compaction_a_prewarmed_turn_reads_only_its_new_tokens(
    real_server: devserver.RunningServer, tmp_path: Path
) -> None:
    # A low threshold, so that the first compaction comes after a few turns.
    runtime = _runtime(real_server, tmp_path, compact_at=0.3, summary_max_tokens=64, prewarm=True)
    try:
        first = runtime.ensure_session("first")
        async with anyio.create_task_group() as tg:
            # What both front ends run beside their turns.
            tg.start_soon(runtime.keep_warm, [])
            number = 0
            while len(runtime.log.epochs("first")) == 1:
                await runtime.append_user(
                    "first", _message(number), external_key=fresh_external_key()
                )
                await runtime.run_turn(first, lambda status: None)
                number += 1
            # Another session on the same slot takes it meanwhile; once it is done the slot
            # is idle and the compacted session is read back.
            other = runtime.ensure_session("other")
            assert other.slot == first.slot
            await runtime.append_user(
                "other", "Name three colours.", external_key=fresh_external_key()
            )
            await runtime.run_turn(other, lambda status: None)
            await eventually(
                lambda: runtime.log.requests("first")[-1].record.kind is RequestKind.PREWARM, 300
            )
            await runtime.append_user("first", "Say goodbye.", external_key=fresh_external_key())
            await runtime.run_turn(first, lambda status: None)
            tg.cancel_scope.cancel()
        requests = runtime.log.requests("first")
        problems = verify(runtime.log)
    finally:
        await runtime.aclose()
    prewarm, turn = (r.record for r in requests[-2:])
    assert prewarm.kind is RequestKind.PREWARM
    assert prewarm.perf.outcome == "complete", prewarm.perf
    # (How much the prewarm read depends on the server's host prompt cache, which may have
    # kept the session's state when the other one took the slot.)
    assert turn.perf.cache_loss == 0, turn.perf
    assert turn.perf.prompt_n is not None
    assert turn.perf.prompt_n < 30, turn.perf
    assert problems == []


# Without the host prompt cache (so the other session really evicts the first one's prompt and
# the prewarm has a long read to do), and with a small batch (so the server can stop between
# batches soon after the prewarm's connection closes).
NO_HOST_CACHE = devserver.ServerLayout(cache_ram_mib=0)
SMALL_BATCH = ("-b", "128", "-ub", "128")
# The server sees a closed connection on its next poll (about a second) and stops after the
# batch it is in; allowed generously, on a loaded two-core machine.
CANCELLATION_ALLOWANCE_MS = 4000


@pytest.mark.timeout(900)
@pytest.mark.anyio
async def test_a_turn_arriving_during_a_prewarm_waits_only_for_its_cancellation() -> None:
    with tempfile.TemporaryDirectory(prefix="lp") as tmp:
        work = Path(tmp)
        server = devserver.start(
            work / "server",
            devserver.default_cache_dir(),
            socket_path=work / "llama.sock",
            layout=NO_HOST_CACHE,
            extra_args=SMALL_BATCH,
        )
        try:
            runtime = Runtime.open(
                load_settings(
                    infer_url=server.url,
                    model=devserver.PLAIN_MODEL,
                    state_dir=work / "state",
                    slots=(0,),
                    temperature=0.0,
                    max_tokens=16,
                    think_cap=0,
                    prewarm=True,
                )
            )
            try:
                first = runtime.ensure_session("first")
                for number in range(6):
                    await _turn(runtime, "first", _message(number))
                await _turn(runtime, "other", "Name three colours.")  # evicts first's prompt
                results: list[PrewarmResult] = []
                async with anyio.create_task_group() as tg:

                    async def prewarm() -> None:
                        results.append(await runtime.prewarm(first))

                    tg.start_soon(prewarm)
                    await eventually(lambda: one_server(runtime).client.slot_busy(0), 60)
                    await runtime.append_user(
                        "first", "Say goodbye.", external_key=fresh_external_key()
                    )
                    outcome = await runtime.run_turn(first, lambda status: None)
                requests = runtime.log.requests("first")
                problems = verify(runtime.log)
            finally:
                await runtime.aclose()
        finally:
            server.stop()
    assert results == [PrewarmResult(PrewarmOutcome.CANCELLED, "real work needed the slot")]
    assert outcome.failure is None, outcome.failure
    prewarm_record, turn = (r.record for r in requests[-2:])
    assert prewarm_record.kind is RequestKind.PREWARM
    assert prewarm_record.perf.outcome == "cancelled"
    assert turn.kind is RequestKind.TURN
    # The turn waited in the server's queue only while the prewarm was being stopped.
    assert turn.perf.queue_wait_ms is not None
    assert turn.perf.queue_wait_ms <= CANCELLATION_ALLOWANCE_MS, turn.perf
    assert problems == []


async def _turn(runtime: Runtime, name: str, text: str) -> None:
    session = runtime.ensure_session(name)
    await runtime.append_user(name, text, external_key=fresh_external_key())
    outcome = await runtime.run_turn(session, lambda status: None)
    assert outcome.failure is None, outcome.failure
