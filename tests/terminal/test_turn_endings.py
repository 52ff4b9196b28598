"""Every way a turn ends is final: reopening the session afterwards runs nothing.

One test per way (answered, stopped, a failed request, a time limit, the repeat guard, the round
limit, the call limit): the turn runs in ``loopd run``, then ``loopd chat`` opens the session
again, which runs whatever a turn left pending first. It must send no request and write nothing,
and ``loopd sessions`` must say how the turn ended. The one turn that does resume, for contrast:
a turn cut by a crash (``loopd run`` killed mid-turn) is answered when the session is opened
again.
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from loopd.sessionlog.records import EntryKind
from loopd.terminal.oneshot import EXIT_ANSWERED, EXIT_NO_ANSWER, EXIT_STOPPED
from loopd.turn.loop import Turn
from loopd_dev.fakes.llama import Pace, ScriptedReply, ScriptedToolCall, Trigger
from tests.terminal.support import (
    LOOPD,
    FakeServer,
    entries,
    fake_env,
    fake_llama,
    of_kind,
    until,
)
from tests.test_cli import run_loopd

SESSION = "s"
ROUNDS = Turn.max_rounds  # the round limit of every turn


@dataclass
class Ended:
    server: FakeServer
    env: dict[str, str]
    state_dir: Path


@pytest.fixture
def ended(tmp_path: Path) -> Iterator[Ended]:
    with fake_llama() as server:
        yield Ended(server, fake_env(server, tmp_path), tmp_path)


def run_turn(ended: Ended, *settings: tuple[str, str]) -> subprocess.CompletedProcess[str]:
    env = ended.env | {f"LOOPD_{name.upper()}": value for name, value in settings}
    return run_loopd(["run", "Do the thing.", "--session", SESSION], env)


def reopen_runs_nothing(ended: Ended) -> str:
    """Open the session again as a person would (``loopd chat``, here with nothing typed):
    nothing is sent, nothing is written. Returns the session's row of ``loopd sessions``."""
    requests_before = ended.server.chat_requests()
    log_before = entries(ended.state_dir, SESSION)
    chat = run_loopd(["chat", "--session", SESSION], ended.env)
    assert chat.returncode == 0, chat.stderr
    assert chat.stdout == ""
    assert ended.server.chat_requests() == requests_before, "the ended turn ran again"
    assert entries(ended.state_dir, SESSION) == log_before
    listed = run_loopd(["sessions"], ended.env)
    [row] = [line for line in listed.stdout.splitlines() if line.startswith(f"{SESSION} ")]
    return row


def test_an_answered_turn(ended: Ended) -> None:
    ended.server.script(ScriptedReply(content="Done."))
    assert run_turn(ended).returncode == EXIT_ANSWERED
    assert reopen_runs_nothing(ended).endswith("  answered")


def test_a_stopped_turn(ended: Ended) -> None:
    ended.server.faults(stall_before_first_byte=True)
    process = subprocess.Popen(
        [*LOOPD, "run", "Do the thing.", "--session", SESSION],
        env=ended.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        until(lambda: ended.server.chat_requests() == 1, "the turn's request", 60)
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == EXIT_STOPPED, err
    ended.server.faults(stall_before_first_byte=False)
    assert "  stopped by @" in reopen_runs_nothing(ended)


def test_a_turn_whose_request_failed(ended: Ended) -> None:
    ended.server.script(ScriptedReply(content="This answer breaks off in the middle of it."))
    ended.server.faults(error_mid_stream=Trigger(after=3))
    assert run_turn(ended).returncode == EXIT_NO_ANSWER
    ended.server.faults(error_mid_stream=None)
    assert "  ended: " in reopen_runs_nothing(ended)


def test_a_turn_that_reached_a_time_limit(ended: Ended) -> None:
    ended.server.faults(stall_before_first_byte=True)
    result = run_turn(ended, ("first_byte_s", "1"))
    assert result.returncode == EXIT_NO_ANSWER, result.stderr
    ended.server.faults(stall_before_first_byte=False)
    assert "  ended: " in reopen_runs_nothing(ended)


def test_a_turn_the_repeat_guard_ended(ended: Ended) -> None:
    call = ScriptedReply(tool_calls=(ScriptedToolCall("list_dir", '{"path": "."}'),))
    ended.server.script(*[call] * 3)
    result = run_turn(ended)
    assert result.returncode == EXIT_NO_ANSWER, result.stderr
    assert "ended: the model repeated a call (list_dir" in reopen_runs_nothing(ended)


def distinct_calls(count: int) -> list[ScriptedReply]:
    """``count`` replies, each one call of another folder (none exists: each call fails)."""
    return [
        ScriptedReply(tool_calls=(ScriptedToolCall("list_dir", f'{{"path": "d{n}"}}'),))
        for n in range(count)
    ]


def test_a_turn_that_reached_the_round_limit(ended: Ended) -> None:
    ended.server.script(*distinct_calls(ROUNDS))
    # The round limit alone: the guards that would end such a turn sooner are off.
    result = run_turn(ended, ("failure_limit", "0"), ("cycle_limit", "0"))
    assert result.returncode == EXIT_NO_ANSWER, result.stderr
    assert ended.server.chat_requests() == ROUNDS
    assert f"ended: stopped after {ROUNDS} tool rounds" in reopen_runs_nothing(ended)


def test_a_turn_that_reached_the_call_limit(ended: Ended) -> None:
    ended.server.script(*distinct_calls(3))
    result = run_turn(ended, ("calls_per_turn", "2"), ("failure_limit", "0"))
    assert result.returncode == EXIT_NO_ANSWER, result.stderr
    row = reopen_runs_nothing(ended)
    assert "ended: the model made more than 2 tool calls in one turn" in row


def test_only_a_turn_cut_by_a_crash_runs_again(ended: Ended) -> None:
    ended.server.script(ScriptedReply(content="word " * 400), ScriptedReply(content="Done."))
    ended.server.portal.call(lambda: setattr(ended.server.fake, "pace", Pace(20)))
    process = subprocess.Popen(
        [*LOOPD, "run", "Do the thing.", "--session", SESSION],
        env=ended.env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        until(lambda: ended.server.chat_requests() == 1, "the turn's request", 60)
    finally:
        process.kill()  # a crash: no chance to record anything
        process.wait()
    ended.server.portal.call(lambda: setattr(ended.server.fake, "pace", Pace()))
    listed = run_loopd(["sessions"], ended.env).stdout
    assert [line for line in listed.splitlines() if line.endswith("  pending turn")]
    chat = run_loopd(["chat", "--session", SESSION], ended.env)
    assert chat.returncode == 0, chat.stderr
    assert ended.server.chat_requests() == 2, "the cut turn was answered when reopened"
    answers = of_kind(entries(ended.state_dir, SESSION), EntryKind.ASSISTANT)
    assert len(answers) == 1
