"""In the terminal, a tool call brokerd holds for approval asks y/n: ``y`` allows it, ``n``
denies it, and no answer within the time limit denies it; the model reads who decided."""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

import pytest

from loopd.config import load_settings
from loopd.sessions import Runtime
from loopd.terminal.approve import TerminalAsker
from loopd_dev.fakes.llama import FakeLlama, RunningFake
from tests.approvals.support import asking_broker, audit_approvals, script_a_call, tool_results
from tests.chat.conftest import FAKE_MODEL
from tests.engine.engine_support import one_server

pytestmark = pytest.mark.anyio


async def run_turn(
    tmp_path: Path,
    sockets: Path,
    fake: FakeLlama,
    llama: RunningFake,
    answer: Callable[[Runtime, threading.Event], str],
    timeout_s: float = 60.0,
) -> tuple[str, list[str]]:
    """One turn that calls the asking tool; the last tool result and what the prompt wrote."""
    script_a_call(fake, FAKE_MODEL)
    shown: list[str] = []
    async with asking_broker(tmp_path, sockets) as broker_url:
        settings = load_settings(
            infer_url=llama.base_url,
            model=FAKE_MODEL,
            broker_url=broker_url,
            state_dir=tmp_path / "state",
            max_tokens=256,
            think_cap=0,
            approval={"timeout_s": timeout_s},
        )
        runtime = Runtime.open(settings)
        try:
            session = runtime.ensure_session("terminal")
            await runtime.append_user("terminal", "echo hi", external_key="k1")
            asker = TerminalAsker(
                "me",
                write=shown.append,
                read_line=lambda stop: answer(runtime, stop),
                answering=lambda: nullcontext(""),
            )
            outcome = await runtime.run_turn(session, lambda status: None, asker=asker)
        finally:
            await runtime.aclose()
    assert outcome.answer == "Done."
    return tool_results(settings.db_path, "terminal")[-1], shown


async def test_y_allows_the_call(
    tmp_path: Path, sockets: Path, fake_llama: FakeLlama, llama: RunningFake
) -> None:
    result, shown = await run_turn(
        tmp_path, sockets, fake_llama, llama, lambda runtime, stop: "y\n"
    )
    assert result == "Allowed by @me.\necho: hi"
    assert (
        "echo_text wants to run with these arguments. It says: Echo a text back (for tests).\n"
        '{\n  "text": "hi"\n}\n' in shown[0]
    )
    assert "Allow it? [y/N]" in shown[0]
    assert shown[1] == "✅ allowed by @me\n"  # the answer, echoed as decided
    assert audit_approvals(tmp_path) == [("echo_text", "allow", "@me")]


async def test_n_denies_the_call(
    tmp_path: Path, sockets: Path, fake_llama: FakeLlama, llama: RunningFake
) -> None:
    result, _ = await run_turn(tmp_path, sockets, fake_llama, llama, lambda r, s: "n\n")
    assert result.startswith("echo_text was not run: @me denied this call.")


async def test_no_answer_in_time_denies_the_call(
    tmp_path: Path, sockets: Path, fake_llama: FakeLlama, llama: RunningFake
) -> None:
    stopped: list[bool] = []

    def silent(runtime: Runtime, stop: threading.Event) -> str:
        stopped.append(stop.wait(10))  # nobody types; the asker stops the read at the limit
        return ""

    result, _ = await run_turn(tmp_path, sockets, fake_llama, llama, silent, timeout_s=1.0)
    assert stopped == [True]
    assert "nobody allowed it in time (no answer within 1 second)" in result


async def test_the_wait_gives_the_slot_to_other_sessions(
    tmp_path: Path, sockets: Path, fake_llama: FakeLlama, llama: RunningFake
) -> None:
    holders: list[str | None] = []

    def answer(runtime: Runtime, stop: threading.Event) -> str:
        holders.append(one_server(runtime).scheduler.holder(0))  # while the person decides
        return "y\n"

    result, _ = await run_turn(tmp_path, sockets, fake_llama, llama, answer)
    assert holders == [None]
    assert result == "Allowed by @me.\necho: hi"
