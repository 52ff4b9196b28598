"""``loopd run "PROMPT"``: the answer on stdout, ``--json``, and each documented exit status; and
``loopd log export --format openai`` byte for byte against what the last request sent."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from loopd.sessionlog.records import EntryKind
from loopd.terminal.oneshot import EXIT_ANSWERED, EXIT_CANNOT, EXIT_NO_ANSWER, EXIT_STOPPED
from loopd.turnstop import STOPPED
from loopd_dev import devserver
from loopd_dev.fakes.llama import Pace, ScriptedReply, ScriptedToolCall, Trigger
from tests.terminal.support import (
    LOOPD,
    array_digest,
    entries,
    fake_env,
    fake_llama,
    loopd_env,
    of_kind,
    requests,
    split_array,
    until,
)
from tests.test_cli import run_loopd

ANSWER = "Two files: a.txt and b.txt."


def test_run_prints_the_answer_and_exits_0(tmp_path: Path) -> None:
    with fake_llama() as server:
        server.script(ScriptedReply(content=ANSWER))
        result = run_loopd(
            ["run", "What is here?", "--session", "s"],
            fake_env(server, tmp_path),
        )
    assert result.returncode == EXIT_ANSWERED, result.stderr
    assert result.stdout == ANSWER + "\n"
    assert "Traceback" not in result.stderr


def test_run_json_has_the_answer_the_tool_calls_and_the_perf_records(tmp_path: Path) -> None:
    with fake_llama() as server:
        server.script(
            ScriptedReply(
                reasoning="Look first.",
                tool_calls=(ScriptedToolCall("list_dir", '{"path": "."}', "call_1"),),
            ),
            ScriptedReply(content=ANSWER),
        )
        result = run_loopd(["run", "What is here?", "--json"], fake_env(server, tmp_path))
    assert result.returncode == EXIT_ANSWERED, result.stderr
    record = json.loads(result.stdout)
    assert record["ended"] == "answered"
    assert record["answer"] == ANSWER
    assert record["failure"] is None
    assert record["session"].startswith("run-")  # a session of its own
    [call] = record["tool_calls"]
    assert (call["id"], call["name"], call["arguments"]) == ("call_1", "list_dir", '{"path": "."}')
    assert "empty directory" in call["result"]
    assert [p["kind"] for p in record["perf"]] == ["turn", "tool_followup"]
    stored = requests(tmp_path, record["session"])
    assert [p["request_row"] for p in record["perf"]] == [r.id for r in stored]
    assert all(isinstance(p["prompt_n"], int) for p in record["perf"])


def test_a_perf_records_request_id_is_the_id_its_log_lines_carry(tmp_path: Path) -> None:
    """One name, one meaning: ``request_id`` is the hex id of the request's log lines, and the
    integer row of the session log is ``request_row``, in ``run --json`` and in ``log export``."""
    with fake_llama() as server:
        server.script(
            ScriptedReply(tool_calls=(ScriptedToolCall("list_dir", '{"path": "."}', "call_1"),)),
            ScriptedReply(content=ANSWER),
        )
        env = fake_env(server, tmp_path) | {"LOOPD_LOG_FORMAT": "json"}
        result = run_loopd(["run", "What is here?", "--json", "--session", "s"], env)
    assert result.returncode == EXIT_ANSWERED, result.stderr
    perf = json.loads(result.stdout)["perf"]
    lines = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    logged = [line["request_id"] for line in lines if line["msg"] == "model request"]
    assert [p["request_id"] for p in perf] == logged
    assert all(len(rid) == 16 and int(rid, 16) >= 0 for rid in logged), logged
    assert len(set(logged)) == 2
    rows = [r.id for r in requests(tmp_path, "s")]
    assert [p["request_row"] for p in perf] == rows
    export = run_loopd(["log", "export", "s"], env)
    assert export.returncode == 0, export.stderr
    exported = [json.loads(line) for line in export.stdout.splitlines()]
    assert "request_id" not in exported[0]
    answered = [e["request_row"] for e in exported if e["request_row"] is not None]
    assert answered == rows


def test_run_exits_1_when_the_turn_ends_without_an_answer(tmp_path: Path) -> None:
    with fake_llama() as server:
        server.script(ScriptedReply(content="This answer breaks off in the middle of it."))
        server.faults(error_mid_stream=Trigger(after=3))
        result = run_loopd(
            ["run", "Hello?", "--session", "s", "--json"],
            fake_env(server, tmp_path),
        )
    assert result.returncode == EXIT_NO_ANSWER, result.stderr
    record = json.loads(result.stdout)
    assert record["ended"] == "failed"
    assert record["answer"] is None
    assert "error" in record["failure"]
    assert record["perf"][0]["outcome"] == "broken"


def test_run_exits_2_with_one_line_when_it_cannot_run(tmp_path: Path) -> None:
    unreachable = run_loopd(["run", "Hello?"], loopd_env("http://127.0.0.1:1", tmp_path))
    assert unreachable.returncode == EXIT_CANNOT
    assert len(unreachable.stderr.strip().splitlines()) == 1, unreachable.stderr
    assert "127.0.0.1:1" in unreachable.stderr
    empty = run_loopd(["run", "  "], loopd_env("http://127.0.0.1:1", tmp_path))
    assert empty.returncode == EXIT_CANNOT
    assert empty.stderr == (
        "loopd: run: the prompt is empty; give the message to send (or - for stdin)\n"
    )


@pytest.mark.parametrize("command", [["run", "Hello?"], ["chat"]])
def test_slots_the_server_does_not_have_are_refused(tmp_path: Path, command: list[str]) -> None:
    with fake_llama() as server:
        env = fake_env(server, tmp_path) | {"LOOPD_SLOTS": "0,7"}
        result = run_loopd([*command, "--session", "s"], env, stdin="Hello?\n")
        assert server.chat_requests() == 0
    assert result.returncode == EXIT_CANNOT
    assert result.stderr == (
        f"loopd: LOOPD_SLOTS: the server at {server.url} has 2 slots (0 and 1); 7 is not among "
        "them\n"
    )


def test_run_reads_the_prompt_from_stdin(tmp_path: Path) -> None:
    with fake_llama() as server:
        server.script(ScriptedReply(content=ANSWER))
        result = run_loopd(
            ["run", "-", "--session", "s"],
            fake_env(server, tmp_path),
            stdin="A question\nover two lines.\n",
        )
    assert result.returncode == EXIT_ANSWERED, result.stderr
    [user] = of_kind(entries(tmp_path, "s"), EntryKind.USER)
    assert json.loads(user.message or "")["content"] == "A question\nover two lines."


def test_ctrl_c_stops_the_run_records_the_stop_and_exits_130(tmp_path: Path) -> None:
    with fake_llama(Pace(tokens_per_second=20)) as server:
        server.script(ScriptedReply(content="word " * 400))
        process = subprocess.Popen(
            [*LOOPD, "run", "Talk for a while.", "--session", "s"],
            env=fake_env(server, tmp_path),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        until(lambda: server.chat_requests() == 1, "the turn's request", 30)
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=30)
    assert process.returncode == EXIT_STOPPED, err
    assert out == ""
    # Logs are JSON lines on stderr here (not a terminal); the last line is the run's own.
    assert err.splitlines()[-1] == "loopd: run: stopped (Ctrl-C); the turn is recorded as stopped"
    stop = of_kind(entries(tmp_path, "s"), EntryKind.BROKEN)[-1]
    assert (stop.fields.reason or "").startswith(f"{STOPPED}@")
    # loopd sessions says the turn was stopped, not that it waits to be answered.
    listed = run_loopd(["sessions"], fake_env(server, tmp_path))
    [row] = [line for line in listed.stdout.splitlines() if line.startswith("s ")]
    assert "  stopped by @" in row, row


@pytest.mark.real_server
def test_run_and_log_export_openai_on_the_real_server(
    real_server: devserver.RunningServer, tmp_path: Path
) -> None:
    env = loopd_env(real_server.url, tmp_path, max_tokens="40", temperature="0", think_cap="0")
    first = run_loopd(["run", "Say hello.", "--session", "real"], env)
    assert first.returncode == EXIT_ANSWERED, first.stderr
    assert first.stdout.strip()
    second = run_loopd(["run", "Name a colour.", "--session", "real", "--json"], env)
    assert second.returncode == EXIT_ANSWERED, second.stderr
    record = json.loads(second.stdout)
    assert record["ended"] == "answered"
    assert record["tool_calls"] == []
    [perf] = record["perf"]
    assert perf["kind"] == "turn"
    assert perf["cache_n"] > 0, "the second turn reuses the first's prompt"

    export = run_loopd(["log", "export", "--format", "openai"], env)  # the last session
    assert export.returncode == 0, export.stderr
    messages = split_array(export.stdout)
    last = requests(tmp_path, "real")[-1].record
    # The array is the last request's messages byte for byte, then the answer it got.
    assert array_digest(messages[: last.message_count]) == last.messages_sha256
    answer = of_kind(entries(tmp_path, "real"), EntryKind.ASSISTANT)[-1]
    assert messages[last.message_count :] == [answer.message]
    assert json.loads(messages[-1])["content"] == record["answer"]


def test_run_answers_without_importing_what_it_did_not_use(tmp_path: Path) -> None:
    # ``loopd run``'s start-up is CPU a person waits through before the request goes out (``make
    # bench``'s start-up section): jsonschema waits for the first tool call or an operator's tools
    # file, the self-test's probes for a self-test.
    with fake_llama() as server:
        server.script(ScriptedReply(content=ANSWER))
        env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPD_")}
        result = subprocess.run(
            [sys.executable, "-X", "importtime", *LOOPD[1:], "run", "What is here?"],
            env=env | fake_env(server, tmp_path),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert result.returncode == EXIT_ANSWERED, result.stderr
    assert result.stdout == ANSWER + "\n"
    lines = [line for line in result.stderr.splitlines() if line.startswith("import time:")]
    loaded = {line.rsplit("|", 1)[1].strip() for line in lines}
    assert {"loopd.terminal.oneshot", "loopd.tools.spec", "httpx"} <= loaded  # the list was read
    unused = {"jsonschema", "loopcommon.schemas", "loopd.selftest.probe", "loopd.selftest.run"}
    assert not loaded & unused, sorted(loaded & unused)
