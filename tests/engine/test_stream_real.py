"""The streaming request against the real llama-server: queued, capped, stopped, killed."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import anyio
import pytest

from loopcommon.jsonbytes import dumps
from loopd.engine.client import InferenceClient
from loopd.engine.limits import Limits
from loopd.engine.outcome import Failure
from loopd.engine.progress import Phase, Status
from loopd.engine.request import RequestSettings, Sampling, build_body
from loopd.engine.stream import run_request
from loopd_dev import devserver

pytestmark = [pytest.mark.real_server, pytest.mark.anyio]

GREEDY = Sampling(temperature=0.0)


def body_for(model: str, slot: int, text: str, max_tokens: int = 40, **extra: object) -> bytes:
    settings = RequestSettings(model=model, slot=slot, max_tokens=max_tokens, sampling=GREEDY)
    body = build_body(settings, "", [dumps({"role": "user", "content": text})])
    if not extra:
        return body
    obj = json.loads(body)
    obj.update(extra)
    return dumps(obj).encode()


async def test_request_behind_a_long_generation_is_queued_then_completes(
    real_server: devserver.RunningServer,
) -> None:
    slot = 1
    seen: list[Status] = []
    async with InferenceClient(real_server.url, devserver.PLAIN_MODEL) as client:
        # ignore_eos keeps the blocker generating for its whole max_tokens.
        blocker = body_for(devserver.PLAIN_MODEL, slot, "Count.", max_tokens=150, ignore_eos=True)
        results = {}

        async def run_blocker() -> None:
            results["blocker"] = await run_request(client, blocker, slot=slot, limits=Limits())

        async with anyio.create_task_group() as tg:
            tg.start_soon(run_blocker)
            # Wait until the blocker holds the slot, then queue behind it.
            with anyio.fail_after(30):
                while not await client.slot_busy(slot):  # noqa: ASYNC110 - polls the server
                    await anyio.sleep(0.05)
            queued = await run_request(
                client,
                body_for(devserver.PLAIN_MODEL, slot, "Say hi."),
                slot=slot,
                limits=Limits(slots_poll_s=0.1, first_byte_s=120),
                report=seen.append,
            )
    assert results["blocker"].complete
    assert queued.complete, queued.detail
    assert Phase.QUEUED in {s.phase for s in seen}
    assert queued.wait.parts()["server_queue_ms"] > 200
    assert queued.first_byte_s is not None


async def test_low_thinking_cap_ends_reasoning_with_the_control_call(
    real_server: devserver.RunningServer,
) -> None:
    async with InferenceClient(real_server.url, devserver.THINKING_MODEL) as client:
        body = body_for(
            devserver.THINKING_MODEL,
            0,
            "Think step by step: a farmer has 17 sheep, buys 23 more and sells 9. How many?",
            max_tokens=300,
        )
        result = await run_request(client, body, slot=0, limits=Limits(think_cap=20))
    asm = result.assembler
    assert result.complete, result.detail
    assert result.capped
    assert result.control_answer == "success"
    assert asm.finish_reason in ("stop", "length")
    assert asm.reasoning, "the model thought before the cap"
    assert asm.content, "after the cap the model answered"
    # Ended by the server, within the grace of where the control call's answer was read: the
    # tokens written during the call's round trip (long on a loaded machine) are not a runaway.
    assert result.control is not None
    answered_at = result.control.answered_at
    assert 20 <= answered_at <= asm.thinking_tokens < answered_at + Limits().think_grace


def _start(workdir: Path, socket: Path) -> devserver.RunningServer:
    return devserver.start(
        workdir, devserver.default_cache_dir(), socket_path=socket, load=(devserver.PLAIN_MODEL,)
    )


async def test_stopped_server_fails_within_the_silence_limit_then_recovers(
    tmp_path: Path,
) -> None:
    server = _start(tmp_path, tmp_path / "llama.sock")
    try:
        pid = server.process.pid

        def freeze_on_first_token(status: Status) -> None:
            if status.phase is Phase.ANSWERING:
                os.kill(pid, signal.SIGSTOP)

        async with InferenceClient(server.url, devserver.PLAIN_MODEL) as client:
            body = body_for(devserver.PLAIN_MODEL, 0, "Tell a story.", 120, ignore_eos=True)
            with anyio.fail_after(20):
                broken = await run_request(
                    client, body, slot=0, limits=Limits(silence_s=1.0), report=freeze_on_first_token
                )
            os.kill(pid, signal.SIGCONT)
            assert broken.failure is Failure.SILENCE
            assert server.url in broken.detail
            assert "silent for 1 s" in broken.detail
            assert not broken.complete
            again = await run_request(
                client, body_for(devserver.PLAIN_MODEL, 0, "Say hi."), slot=0, limits=Limits()
            )
        assert again.complete, again.detail
    finally:
        os.kill(server.process.pid, signal.SIGCONT)
        server.stop()


async def test_killed_server_breaks_the_stream_and_a_restarted_one_answers_cold(
    tmp_path: Path,
) -> None:
    socket = tmp_path / "llama.sock"
    server = _start(tmp_path / "a", socket)
    try:

        def kill_on_first_token(status: Status) -> None:
            if status.phase is Phase.ANSWERING and server.process.poll() is None:
                os.killpg(server.process.pid, signal.SIGKILL)

        async with InferenceClient(server.url, devserver.PLAIN_MODEL) as client:
            body = body_for(devserver.PLAIN_MODEL, 0, "Tell a story.", 120, ignore_eos=True)
            # A silence limit the loaded CI box cannot hit before the first token: the kill,
            # not a slow prefill, is what must break this stream.
            broken = await run_request(
                client, body, slot=0, limits=Limits(silence_s=60), report=kill_on_first_token
            )
            # The kill is asynchronous: wait for the process to be gone, then check it was killed.
            assert server.process.wait(timeout=10) == -signal.SIGKILL, broken.detail
            assert broken.failure in (Failure.TRUNCATED, Failure.SILENCE), broken.detail
            assert not broken.complete
            gone = await run_request(client, body, slot=0, limits=Limits(slots_poll_s=0.1))
            assert gone.failure is Failure.UNREACHABLE
            assert str(socket) in gone.detail
            server.process.wait()
            restarted = _start(tmp_path / "b", socket)
            try:
                again = await run_request(
                    client, body_for(devserver.PLAIN_MODEL, 0, "Say hi."), slot=0, limits=Limits()
                )
            finally:
                restarted.stop()
        assert again.complete, again.detail
        assert again.assembler.timings is not None
        assert again.assembler.timings.cache_n == 0, "a restarted server has a cold cache"
    finally:
        server.stop()
