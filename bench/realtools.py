"""Real tool calls: a session whose tool calls the tool model (``qwen-coder-tools``) makes itself,
through loopd, against the same conversation sent by the naive client; and the repeat guard's
cost with and without it.

Beside the scripted session of ``bench/cache_reuse.py``: there the calls are given; here the
server parses them from the model's own stream, loopd stores the arguments as streamed and runs
them in the session's workspace, and the next request replays them. Each request's prompt is
compared with the ideal (``bench/ideal.py``: only the tokens new since the previous request's
prompt and reply) and with the naive client's rendering of the same history (``bench/naive.py``,
sent with ``max_tokens`` 1: the prompt is what is measured).

The repeat guard (``LOOPD_REPEAT_LIMIT``): the model calls the same tool again after every
result, so one turn runs with the guard (the default, 2) and once without (0, until the turn's
16 rounds run out); each turn's rounds and GPU seconds (the server's ``prompt_ms`` +
``predicted_ms`` of its requests, from the perf records).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx

from bench.ideal import PromptTokens, ideal
from bench.naive import NaiveHarness
from loopd.config import load_settings
from loopd.engine.client import make_async_client
from loopd.engine.outcome import TurnOutcome
from loopd.sessionlog import RequestRecord
from loopd.sessionlog.records import fresh_external_key
from loopd.sessions import Runtime
from loopd.tools.workspace import session_workspace
from loopd_dev import devserver

log = logging.getLogger("bench.realtools")

# The session: a workspace with two files and one request for them. The model lists the folder,
# reads a file it saw, and goes on calling tools (it never answers): the guard or the round limit
# ends the turn. (A second turn asking to read a file ran all 16 rounds: the model changed its
# call a little after each pointer, so no call was made three times.)
FILES = {"notes.txt": "first notes\n", "todo.txt": "write the report\n"}
TURNS = ('List the files in the folder "." of the workspace.',)
# A request the model answers with the same call after every result.
GUARD_PROMPT = "Run the command `ls -a` with run_command."


@dataclass(frozen=True)
class Step:
    """One request of the session: what each client made the server read."""

    turn: int
    tool_calls: str  # the calls the model made in its reply, as name(arguments)
    loopd_cache_n: int
    loopd_prompt_n: int
    ideal_new: int
    naive_prompt_n: int
    loss_cause: str | None


@dataclass(frozen=True)
class GuardRun:
    limit: int
    rounds: int
    gpu_s: float
    ended: str


@dataclass(frozen=True)
class RealTools:
    steps: list[Step]
    guard: list[GuardRun]


def gpu_s(records: list[RequestRecord]) -> float:
    """The server's time on ``records``: ``prompt_ms`` + ``predicted_ms``, in seconds."""
    ms = sum(
        float(r.perf.extra.get("prompt_ms") or 0) + float(r.perf.extra.get("predicted_ms") or 0)
        for r in records
    )
    return ms / 1000


def _runtime(url: str, state: Path, repeat_limit: int) -> Runtime:
    settings = load_settings(
        infer_url=url,
        model=devserver.TOOL_MODEL,
        state_dir=state,
        broker_url="unix:/nonexistent",  # core tools only
        repeat_limit=repeat_limit,
        **devserver.TOOL_MODEL_SETTINGS,
    )
    return Runtime.open(settings)


async def _turn(runtime: Runtime, session: str, text: str) -> TurnOutcome:
    state = runtime.ensure_session(session)
    runtime.log.append_user(session, text, external_key=fresh_external_key())
    return await runtime.run_turn(state, lambda status: None)


async def _session(url: str, work: Path) -> list[Step]:
    """The session through loopd, then the same history through the naive client."""
    session = "bench-real-tools"
    runtime = _runtime(url, work / "loopd", repeat_limit=2)
    workspace = session_workspace(runtime.settings.workspaces, session)
    for name, text in FILES.items():
        (workspace / name).write_text(text)
    try:
        outcomes = [await _turn(runtime, session, text) for text in TURNS]
        messages = runtime.log.replay_messages(session)
        system_text, tools_text = runtime.settings.system_text, runtime.spec.text
    finally:
        await runtime.aclose()
    records = [r for outcome in outcomes for r in outcome.requests]
    turn_of = [n for n, outcome in enumerate(outcomes, 1) for _ in outcome.requests]
    recorded = Recorded(messages, records, turn_of, system_text, tools_text)
    [steps] = await against_clients(url, devserver.TOOL_MODEL, [recorded])
    return steps


@dataclass(frozen=True)
class Recorded:
    """A session as loopd's log holds it: its replayed messages, its requests (each with the
    number of messages it sent), the turn each request belongs to, its system text and tools."""

    messages: list[str]
    records: list[RequestRecord]
    turn_of: list[int]
    system_text: str
    tools_text: str


async def against_clients(url: str, model: str, sessions: list[Recorded]) -> list[list[Step]]:
    """Each request of each of ``sessions`` (in the order they ran on one server) beside the
    ideal (its new tokens: those after what the server held from the request before it, of
    this session or the one before) and the naive client's prompt for the same history (sent
    with ``max_tokens`` 1)."""
    async with make_async_client(url, connect_s=30.0) as http:
        tokens = PromptTokens(http, model)
        held: list[int] | None = None
        compared = []
        for session in sessions:
            steps, held = await _against(http, tokens, model, session, held)
            compared.append(steps)
    return compared


async def _against(
    http: httpx.AsyncClient,
    tokens: PromptTokens,
    model: str,
    session: Recorded,
    held: list[int] | None,
) -> tuple[list[Step], list[int] | None]:
    messages, records, tools_text = session.messages, session.records, session.tools_text
    sent = [r.message_count for r in records]
    naive = NaiveHarness(
        http,
        model=model,
        system_text=session.system_text,
        tools=json.loads(tools_text),
        sampling={"temperature": 0.0},
    )
    steps: list[Step] = []
    previous = held
    replayed = 1  # the naive history holds messages[1:replayed] (the system line is its own)
    for index, record in enumerate(records):
        body = {
            "model": model,
            "messages": [json.loads(m) for m in messages[: sent[index]]],
            "tools": json.loads(tools_text),
        }
        prompt = await tokens.of(json.dumps(body).encode())
        carried = (records[index - 1].perf.predicted_n or 0) if index else 0
        new = ideal(prompt.tokens, previous, carried).new_tokens
        previous = prompt.tokens
        for text in messages[replayed : sent[index]]:
            _add(naive, json.loads(text))
        replayed = sent[index]
        reply = await naive.complete(max_tokens=1)
        reply_message = json.loads(messages[sent[index]]) if sent[index] < len(messages) else {}
        steps.append(
            Step(
                turn=session.turn_of[index],
                tool_calls=", ".join(
                    f"{c['function']['name']}({c['function']['arguments']})"
                    for c in reply_message.get("tool_calls") or ()
                ),
                loopd_cache_n=record.perf.cache_n or 0,
                loopd_prompt_n=record.perf.prompt_n or 0,
                ideal_new=new,
                naive_prompt_n=int(reply.timings.get("prompt_n") or 0),
                loss_cause=record.perf.cache_loss_cause,
            )
        )
    return steps, previous


def _add(naive: NaiveHarness, message: dict[str, object]) -> None:
    role = message.get("role")
    if role == "user":
        naive.add_user(str(message["content"]))
    elif role == "assistant":
        naive.add_assistant(message)
    elif role == "tool":
        naive.add_tool_result(str(message["tool_call_id"]), str(message["content"]))


async def _guard(url: str, work: Path) -> list[GuardRun]:
    runs = []
    for limit in (2, 0):
        runtime = _runtime(url, work / f"guard-{limit}", repeat_limit=limit)
        try:
            session = f"bench-guard-{limit}"
            (session_workspace(runtime.settings.workspaces, session) / "notes.txt").write_text(
                FILES["notes.txt"]
            )
            outcome = await _turn(runtime, session, GUARD_PROMPT)
        finally:
            await runtime.aclose()
        runs.append(
            GuardRun(limit, len(outcome.requests), gpu_s(outcome.requests), outcome.failure or "")
        )
        log.info("repeat limit %d: %d rounds, %.1f GPU s", limit, runs[-1].rounds, runs[-1].gpu_s)
    return runs


async def _measure(url: str, work: Path) -> RealTools:
    steps = await _session(url, work)
    return RealTools(steps, await _guard(url, work))


def run(work: Path, cache_dir: Path) -> RealTools:
    """Start a router of its own with the tool model and measure."""
    log.info("real tool calls: the tool model on a router of its own")
    with devserver.running(
        work / "server",
        cache_dir,
        socket_path=work / "llama.sock",
        load=(devserver.TOOL_MODEL,),
    ) as server:
        try:
            return anyio.run(_measure, server.url, work)
        except httpx.HTTPError as exc:
            raise RuntimeError(f"the real-tool benchmark lost the server: {exc!r}") from exc


def render(result: RealTools) -> str:
    """The report's section."""
    lines = [
        "## Real tool calls (qwen-coder-tools: the model makes its own calls)",
        "",
        "The session's tool calls are the model's own (Qwen2.5-Coder-0.5B-Instruct through the "
        "server's parser), run by loopd's core tools; the naive client sends the same history "
        "rebuilt from parsed fields. Prompt tokens the server read per request:",
        "",
        "| Turn | Request | The model's calls in its reply | loopd cache_n | loopd prompt_n "
        "| ideal (new tokens) | naive prompt_n | loopd's loss cause |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for n, step in enumerate(result.steps, 1):
        lines.append(
            f"| {step.turn} | {n} | `{step.tool_calls or '(text)'}` | {step.loopd_cache_n} "
            f"| {step.loopd_prompt_n} | {step.ideal_new} | {step.naive_prompt_n} "
            f"| {step.loss_cause or ''} |"
        )
    total = [
        sum(s.loopd_prompt_n for s in result.steps),
        sum(s.ideal_new for s in result.steps),
        sum(s.naive_prompt_n for s in result.steps),
    ]
    lines += [
        f"| all | | | | {total[0]} | {total[1]} | {total[2]} | |",
        "",
        "The repeat guard on one turn of the same model (it calls the same tool again after "
        "every result): rounds and GPU seconds (`prompt_ms` + `predicted_ms`) of the turn.",
        "",
        "| LOOPD_REPEAT_LIMIT | Rounds | GPU s | How the turn ended |",
        "|---|---|---|---|",
    ]
    for run_ in result.guard:
        lines.append(
            f"| {run_.limit}{' (off)' if run_.limit == 0 else ''} | {run_.rounds} "
            f"| {run_.gpu_s:.1f} | {run_.ended} |"
        )
    return "\n".join(lines) + "\n"
