"""The agent bench: a dozen small tasks through ``loopd run`` on the agent model
(``qwen-coder-agent``), each in a prepared workspace, with brokerd's tool broker in front of a
catalogue tool and a real MCP server.

For each task: whether it was finished (the turn answered and its check holds: a value in the
answer, a file's new content, a tool's result), the rounds (model requests), the tool calls, the
GPU seconds (the server's ``prompt_ms`` + ``predicted_ms``), and each loop guard that fired.
Beside them, the same turns' prompt tokens against the ideal and the naive client
(``bench.realtools.against_clients``), as the cache-reuse section measures loopd's scripted
sessions.

Each task is one ``loopd run --session NAME --json PROMPT`` process, talking to the router
directly and to brokerd over its socket, with the preset's settings (temperature 0,
``max_tokens`` 150, no thinking cap) and loopd's default guards; greedy decoding makes a run
repeat on the same build.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio

from bench.realtools import Recorded, Step, against_clients, gpu_s
from loopd.sessionlog.store import SessionLog
from loopd.tools.workspace import session_workspace
from loopd_dev import devserver

log = logging.getLogger("bench.agent")


@dataclass(frozen=True)
class Task:
    """One small task: the files its workspace starts with, the prompt, and what finishes it:
    ``answer_has`` in the answer (case folded), ``file_has`` (a path and a text the file must
    hold afterwards, case folded), ``result_has`` in one of the tool results."""

    name: str
    prompt: str
    files: dict[str, str] = field(default_factory=dict)
    answer_has: str = ""
    file_has: tuple[str, str] | None = None
    result_has: str = ""


TASKS = (
    Task(
        "read a value",
        "Read garden.txt and name the flower it mentions.",
        {"garden.txt": "The garden has one flower: a yellow tulip by the gate.\n"},
        answer_has="tulip",
    ),
    Task(
        "a setting",
        "What is the PORT in settings.env?",
        {"settings.env": "HOST=localhost\nPORT=8080\nDEBUG=no\n"},
        answer_has="8080",
    ),
    Task(
        "a line",
        "What is on line 2 of lines.txt?",
        {"lines.txt": "alpha\nbeta\ngamma\n"},
        answer_has="beta",
    ),
    Task(
        "count files",
        "How many files are in the folder docs?",
        {"docs/a.md": "a\n", "docs/b.md": "b\n", "docs/c.md": "c\n"},
        answer_has="3",
    ),
    Task(
        "list then read",
        "Look in the folder reports and tell me the total it records.",
        {"reports/march.txt": "Report for March\ntotal: 1250\n"},
        answer_has="1250",
    ),
    Task(
        "follow a pointer",
        "Read todo.txt, do what it says, and give me the room number.",
        {
            "todo.txt": "The room number is in the file rooms/meeting.txt.\n",
            "rooms/meeting.txt": "The meeting is in room 42.\n",
        },
        answer_has="42",
    ),
    Task(
        "search",
        "Which file mentions kiwi? Use search_files.",
        {"fruit.txt": "apple, kiwi, mango\n", "veg.txt": "leek, onion\n"},
        answer_has="fruit.txt",
    ),
    Task(
        "edit and confirm",
        "In config.txt, change 'mode = slow' to 'mode = fast' with edit_file, then read the "
        "file to confirm.",
        {"config.txt": "mode = slow\nlevel = 3\n"},
        file_has=("config.txt", "mode = fast"),
    ),
    Task(
        "write a file",
        "Write the word hello into a new file greeting.txt.",
        file_has=("greeting.txt", "hello"),
    ),
    Task(
        "run a command",
        "Run the command `wc -l numbers.txt` and tell me how many lines the file has.",
        {"numbers.txt": "1\n2\n3\n4\n5\n"},
        answer_has="5",
    ),
    Task(
        "a catalogue tool",
        "Use find_tool to find a tool that echoes a text, then use call_tool to echo the word "
        "kiwi with it.",
        result_has="echo: kiwi",
    ),
    Task(
        "an MCP tool",
        "Use find_tool to find a tool that tells the current time, then use call_tool to get "
        "the time in the timezone UTC, and tell me the date.",
        answer_has=str(datetime.now(UTC).year),
        result_has='"timezone": "UTC"',
    ),
)

# How the result of a call loopd did not run, pointing to an earlier one, begins
# (``loopd.engine.guards.pointer``).
POINTED = "not run again:"

# The catalogue tool of the tasks (brokerd's catalogue format).
ECHO_TOOL = """name = "echo_text"
description = "Echo a text back."
timeout_s = 5
output_cap_bytes = 4096

[parameters]
type = "object"
properties = { text = { type = "string" } }
required = ["text"]
additionalProperties = false

[run]
kind = "command"
argv = ["echo", "echo:", "{text}"]
"""


@dataclass(frozen=True)
class TaskRun:
    task: Task
    finished: bool
    ended: str  # answered, or the one line the turn ended with
    rounds: int
    tool_calls: int
    gpu_s: float
    wall_s: float
    guards: dict[str, int]  # guard -> firings (pointed calls and the stop)
    steps: list[Step] = field(default_factory=list)


@dataclass(frozen=True)
class AgentBench:
    runs: list[TaskRun]


def run(work: Path, cache_dir: Path) -> AgentBench:
    """A router with the agent model and a broker of the tasks' own; each task through
    ``loopd run``; then the turns' prompts against the ideal and the naive client."""
    log.info("the agent bench: %d tasks on %s", len(TASKS), devserver.AGENT_MODEL)
    with (
        devserver.running(
            work / "server",
            cache_dir,
            socket_path=work / "llama.sock",
            load=(devserver.AGENT_MODEL,),
        ) as server,
        _broker(work / "broker", cache_dir) as broker_url,
    ):
        state = work / "loopd"
        runs = [_task(server.url, broker_url, state, n, task) for n, task in enumerate(TASKS)]
        return AgentBench(anyio.run(_with_cache_figures, server.url, state, runs))


def _session(n: int) -> str:
    return f"task-{n + 1:02d}"


def _environment(infer_url: str, broker_url: str, state: Path) -> dict[str, str]:
    settings = {
        "infer_url": infer_url,
        "model": devserver.AGENT_MODEL,
        "broker_url": broker_url,
        "state_dir": str(state),
        **devserver.AGENT_MODEL_SETTINGS,
    }
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LOOPD_")}
    return clean | {f"LOOPD_{name.upper()}": str(value) for name, value in settings.items()}


def _task(infer_url: str, broker_url: str, state: Path, n: int, task: Task) -> TaskRun:
    session = _session(n)
    workspace = session_workspace(state / "workspaces", session)
    for name, text in task.files.items():
        (workspace / name).parent.mkdir(parents=True, exist_ok=True)
        (workspace / name).write_text(text)
    loopd = Path(sys.executable).with_name("loopd")
    started = time.monotonic()
    done = subprocess.run(
        [str(loopd), "run", "--session", session, "--json", task.prompt],
        env=_environment(infer_url, broker_url, state),
        capture_output=True,
        text=True,
        check=False,
    )
    wall_s = time.monotonic() - started
    if done.returncode not in (0, 1):
        raise RuntimeError(f"loopd run of {task.name!r} failed ({done.returncode}): {done.stderr}")
    record: dict[str, Any] = json.loads(done.stdout)
    finished = record["ended"] == "answered" and _check(task, record, workspace)
    guards: Counter[str] = Counter()  # the guard that ended the turn (pointers: from the log)
    if record.get("guard"):
        guards[f"{record['guard']} stopped"] += 1
    perf = record["perf"]
    run_ = TaskRun(
        task=task,
        finished=finished,
        ended="answered" if record["ended"] == "answered" else str(record["failure"]),
        rounds=len(perf),
        tool_calls=len(record["tool_calls"]),
        gpu_s=0.0,
        wall_s=wall_s,
        guards={name: count for name, count in guards.items() if count},
    )
    log.info(
        "%s: %s, %d rounds, %d calls, %.0f s (%s)",
        task.name,
        "finished" if finished else "not finished",
        run_.rounds,
        run_.tool_calls,
        wall_s,
        (record.get("answer") or run_.ended)[:120].replace("\n", " "),
    )
    return run_


def _check(task: Task, record: dict[str, Any], workspace: Path) -> bool:
    answer = str(record.get("answer") or "").casefold()
    if task.answer_has and task.answer_has.casefold() not in answer:
        return False
    if task.file_has is not None:
        path, text = task.file_has
        target = workspace / path
        held = target.read_text(errors="replace") if target.is_file() else ""
        if text.casefold() not in held.casefold():
            return False
    results = [str(call.get("result", "")) for call in record["tool_calls"]]
    return not task.result_has or any(task.result_has in result for result in results)


async def _with_cache_figures(url: str, state: Path, runs: list[TaskRun]) -> list[TaskRun]:
    """Each task's GPU seconds from its requests' records, every call the model made (``loopd
    run`` lists those that ran) with the repeats loopd answered with a pointer, and its prompts
    against the ideal and the naive client."""
    recorded = []
    with SessionLog.open(state / "loopd.db", create=False) as session_log:
        for n in range(len(runs)):
            name = _session(n)
            records = [request.record for request in session_log.requests(name)]
            messages = session_log.replay_messages(name)
            recorded.append(
                Recorded(
                    messages=messages,
                    records=records,
                    turn_of=[1] * len(records),
                    system_text=json.loads(messages[0])["content"],  # the epoch's system text
                    tools_text=session_log.current_epoch(name).tools_text,
                )
            )
    compared = await against_clients(url, devserver.AGENT_MODEL, recorded)
    figured = []
    for run_, done, steps in zip(runs, recorded, compared, strict=True):
        wire = [json.loads(m) for m in done.messages]
        calls = sum(len(m.get("tool_calls") or ()) for m in wire)
        pointed = sum(
            m.get("role") == "tool" and str(m.get("content")).startswith(POINTED) for m in wire
        )
        guards = {**run_.guards, **({"repeat pointed": pointed} if pointed else {})}
        figured.append(
            replace(
                run_,
                gpu_s=gpu_s(done.records),
                steps=steps,
                tool_calls=calls,
                guards=guards,
            )
        )
    return figured


@contextmanager
def _broker(folder: Path, cache_dir: Path) -> Iterator[str]:
    """brokerd's tool broker with the echo tool in its catalogue and mcp-server-time."""
    catalogue = folder / "catalogue"
    catalogue.mkdir(parents=True)
    (catalogue / "echo_text.toml").write_text(ECHO_TOOL)
    time_server = cache_dir / "mcp" / "python" / "bin" / "mcp-server-time"
    if not time_server.exists():
        raise RuntimeError(f"{time_server} is missing: run `make mcp-servers`")
    config = folder / "brokerd.toml"
    config.write_text(
        "[broker]\n"
        f'audit_db = "{folder / "audit.db"}"\n'
        f'catalogue_dir = "{catalogue}"\n\n'
        "[[mcp]]\n"
        'name = "time"\n'
        f'command = ["{time_server}", "--local-timezone", "UTC"]\n'
    )
    sockets = folder / "sockets"
    env = {k: v for k, v in os.environ.items() if not k.startswith("BROKERD_")}
    env |= {"BROKERD_CONFIG": str(config), "BROKERD_SOCKET_DIR": str(sockets)}
    brokerd = Path(sys.executable).with_name("brokerd")
    with (folder / "brokerd.log").open("wb") as out:
        process = subprocess.Popen(
            [str(brokerd), "serve", "--only", "broker"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        socket = sockets / "broker.sock"
        deadline = time.monotonic() + 60
        while not socket.exists():
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"brokerd did not come up: {(folder / 'brokerd.log').read_text()[-2000:]}"
                )
            time.sleep(0.1)
        yield f"unix:{socket}"
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def render(result: AgentBench) -> str:
    """The report's section."""
    runs = result.runs
    done = sum(r.finished for r in runs)
    lines = [
        f"## The agent bench ({devserver.AGENT_MODEL}: {len(runs)} small tasks through "
        "`loopd run`)",
        "",
        "Each task in a workspace of its own, with loopd's default loop guards; GPU s is the "
        "server's `prompt_ms` + `predicted_ms` of the task's requests; prompt tokens read by "
        "the server for the same turns: loopd, the ideal (only what is new) and the naive "
        "client (the history rebuilt from parsed fields).",
        "",
        "| Task | Finished | How it ended | Rounds | Tool calls | GPU s | Wall s | Guards fired "
        "| loopd prompt_n | ideal | naive prompt_n |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        guards = ", ".join(f"{name} {count}" for name, count in sorted(r.guards.items()))
        lines.append(
            f"| {r.task.name} | {'yes' if r.finished else 'no'} | {r.ended} | {r.rounds} "
            f"| {r.tool_calls} | {r.gpu_s:.1f} | {r.wall_s:.0f} | {guards or '-'} "
            f"| {sum(s.loopd_prompt_n for s in r.steps)} | {sum(s.ideal_new for s in r.steps)} "
            f"| {sum(s.naive_prompt_n for s in r.steps)} |"
        )
    fired: Counter[str] = Counter()
    for r in runs:
        fired.update(r.guards)
    lines += [
        f"| all | {done} of {len(runs)} | | {sum(r.rounds for r in runs)} "
        f"| {sum(r.tool_calls for r in runs)} | {sum(r.gpu_s for r in runs):.1f} "
        f"| {sum(r.wall_s for r in runs):.0f} "
        f"| {', '.join(f'{k} {v}' for k, v in sorted(fired.items())) or '-'} "
        f"| {sum(s.loopd_prompt_n for r in runs for s in r.steps)} "
        f"| {sum(s.ideal_new for r in runs for s in r.steps)} "
        f"| {sum(s.naive_prompt_n for r in runs for s in r.steps)} |",
    ]
    return "\n".join(lines) + "\n"
