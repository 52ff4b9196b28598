"""Cache reuse: the scripted session through loopd, then through the naive client, on one server.

loopd's side goes through its real code path: ``Runtime`` (settings, session log, epoch, slot,
and the ``Turn`` it configures), then for every request the public pieces ``Turn.step`` uses
(``SessionLog.replay_messages``, ``build_body``, ``run_request``). The reply is appended as
streamed: the model's own, or the scripted message in its place. Every request is a real request
to the real server.

A request whose reply will be replaced by a scripted one is sent with ``max_tokens`` 1 by both
clients: the server still processes the whole prompt, which is what is measured, and no time is
spent generating text that is thrown away.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from bench.errors import BenchError
from bench.ideal import (
    TOLERANCE,
    Label,
    Prompt,
    PromptTokens,
    ideal,
    label,
    reply_rendered,
    reply_tokenized_anew,
    resumed_before_divergence,
)
from bench.naive import EVERY_MISTAKE, Mistake, NaiveHarness
from bench.script import SCRIPT, SYSTEM_TEXT, TOOLS, ScriptedCall, UserTurn
from loopcommon.jsonbytes import dumps
from loopd.config import Settings, load_settings
from loopd.engine.client import make_async_client
from loopd.engine.outcome import Failure
from loopd.engine.request import Sampling, build_body
from loopd.engine.stream import run_request
from loopd.sessionlog import Perf, RequestKind, RequestRecord, messages_digest
from loopd.sessions import Runtime
from loopd.turn.loop import Turn
from loopd.wire import AssistantMessage
from loopd_dev.devserver import THINKING_MODEL

log = logging.getLogger("bench.cache")

SESSION = "bench-cache"
# The answer to a tool call the model made on its own (it has no scripted result).
UNPROMPTED_RESULT = "error: no such tool in this benchmark"
CUT_REPLY = "model, not replayed"  # a reply whose tool call max_tokens cut off


@dataclass(frozen=True)
class SessionSettings:
    model: str = THINKING_MODEL
    max_tokens: int = 32  # for the model's own answers
    scripted_max_tokens: int = 1  # for requests whose reply is scripted
    temperature: float = 0.0  # greedy: both clients get the same answers to the same prompt
    think_cap: int = 0  # no cap: the answers end at max_tokens, long before any cap
    # The naive client again with each of its mistakes alone, to show what each one costs.
    one_mistake_runs: bool = True


@dataclass(frozen=True)
class Sent:
    """One request as a client sent it, and what the server reported."""

    turn: int
    after: str  # what came just before: "user message" or "tool result"
    reply: str  # "model" (replayed as generated) or "scripted"
    cache_n: int
    prompt_n: int
    predicted_n: int
    capped: bool  # the reply was capped by loopd's thinking limit
    finish_reason: str | None
    wall_s: float
    cpu_s: float
    body: bytes = b""  # loopd's request body, exactly as sent (empty for the naive client)
    reasoning: str = ""  # the reply's reasoning as loopd stored it


@dataclass(frozen=True)
class CacheRow:
    index: int  # 1-based
    turn: int
    after: str
    reply: str
    prompt_tokens: int  # loopd's whole prompt, counted by the server's tokenizer
    ideal: int
    loopd_cache_n: int
    loopd_prompt_n: int
    naive_cache_n: int
    naive_prompt_n: int
    label: Label
    counted_matches_server: bool  # prompt_tokens == loopd's cache_n + prompt_n
    # Tokens the server re-read from before the divergence: a hybrid model's checkpoint.
    before_divergence: int = 0

    @property
    def over_ideal(self) -> int:
        return self.loopd_prompt_n - self.ideal

    @property
    def meets_target(self) -> bool:
        return self.over_ideal <= TOLERANCE


@dataclass(frozen=True)
class MistakeAlone:
    """A run of the naive client that makes one of its mistakes only."""

    mistake: Mistake
    # The session's total after its first request: each run starts on the cache the run before
    # it left (and the first request is every client's whole prompt), so the runs compare on the
    # requests after it.
    prompt_n_after_first: int


@dataclass(frozen=True)
class CacheResult:
    rows: list[CacheRow]
    settings: SessionSettings
    loopd_model_steps: list[Sent]  # the requests Turn.step ran, for loopd's CPU share
    mistakes_alone: tuple[MistakeAlone, ...] = ()

    @property
    def loopd_total(self) -> int:
        return sum(row.loopd_prompt_n for row in self.rows)

    @property
    def naive_total(self) -> int:
        return sum(row.naive_prompt_n for row in self.rows)

    @property
    def ideal_total(self) -> int:
        return sum(row.ideal for row in self.rows)

    @property
    def rewritten_total(self) -> int:
        """The ideal's tokens on requests after the template rewrote earlier turns."""
        return sum(row.ideal for row in self.rows if row.label is Label.TEMPLATE_REWRITE)

    @property
    def loopd_after_first(self) -> int:
        return sum(row.loopd_prompt_n for row in self.rows[1:])

    @property
    def naive_after_first(self) -> int:
        return sum(row.naive_prompt_n for row in self.rows[1:])

    @property
    def naive_over_loopd(self) -> float:
        return self.naive_total / max(self.loopd_total, 1)

    @property
    def loopd_over_ideal(self) -> float:
        return self.loopd_total / max(self.ideal_total, 1)

    def misses(self) -> list[CacheRow]:
        """Unlabelled requests after the first where loopd's prompt_n misses the target."""
        return [row for row in self.rows if row.label is Label.NONE and not row.meets_target]


# -- loopd ------------------------------------------------------------------------------------


def loopd_settings(url: str, state_dir: Path, s: SessionSettings) -> Settings:
    tools_file = state_dir / "tools.json"
    state_dir.mkdir(parents=True, exist_ok=True)
    tools_file.write_text(dumps(TOOLS), encoding="utf-8")
    return load_settings(
        infer_url=url,
        model=s.model,
        state_dir=state_dir,
        workspace_dir=state_dir / "workspaces",
        tools_file=tools_file,
        broker_url=f"unix:{state_dir / 'no-broker.sock'}",  # the script runs no tools
        slots=(0,),
        max_tokens=s.max_tokens,
        temperature=s.temperature,
        think_cap=s.think_cap,
        system_text=SYSTEM_TEXT,
    )


async def run_loopd(
    url: str, state_dir: Path, s: SessionSettings, script: Sequence[UserTurn] = SCRIPT
) -> list[Sent]:
    runtime = Runtime.open(loopd_settings(url, state_dir, s))
    sent: list[Sent] = []
    try:
        session = runtime.ensure_session(SESSION)
        turn = runtime.turn(session, report=lambda status: None)
        for number, user_turn in enumerate(script, start=1):
            runtime.log.append_user(SESSION, user_turn.text, external_key=f"turn-{number}")
            after = "user message"
            for call in user_turn.calls:
                sent.append(await _scripted_step(turn, s, number, after, call))
                for call_id, result in zip(call.call_ids, call.results, strict=True):
                    runtime.log.append_tool_result(SESSION, tool_call_id=call_id, content=result)
                after = "tool result"
            sent.append(await _model_step(turn, s, number, after))
            log.info("loopd: turn %d done, %d requests", number, len(sent))
    finally:
        await runtime.aclose()
    return sent


def _current_body(turn: Turn, max_tokens: int | None = None) -> tuple[bytes, int, list[str]]:
    epoch = turn.log.current_epoch(turn.session)
    messages = turn.log.replay_messages(turn.session)
    settings = (
        turn.settings if max_tokens is None else replace(turn.settings, max_tokens=max_tokens)
    )
    return build_body(settings, epoch.tools_text, messages), epoch.number, messages


async def _model_step(turn: Turn, s: SessionSettings, number: int, after: str) -> Sent:
    return await _step(turn, s, number, after, None)


async def _scripted_step(
    turn: Turn, s: SessionSettings, number: int, after: str, call: ScriptedCall
) -> Sent:
    return await _step(turn, s, number, after, call)


async def _step(
    turn: Turn, s: SessionSettings, number: int, after: str, call: ScriptedCall | None
) -> Sent:
    """One request built from the log and streamed, as ``Turn.step`` does; then the reply (the
    model's own, or the scripted one) is appended as streamed."""
    max_tokens = s.max_tokens if call is None else s.scripted_max_tokens
    body, epoch, messages = _current_body(turn, max_tokens)
    wall, cpu = time.perf_counter(), time.process_time()
    result = await run_request(turn.client, body, slot=turn.slot, limits=turn.limits)
    timings = result.assembler.timings
    # A reply cut inside a tool call is a complete stream that loopd does not keep (the engine
    # says BAD_TOOL_CALL); the benchmark records it as broken below and goes on.
    cut = result.failure is Failure.BAD_TOOL_CALL and result.assembler.done
    if not (result.complete or cut) or timings is None:
        raise BenchError(f"loopd's request in turn {number} broke: {result.detail}")
    kind = RequestKind.TURN if after == "user message" else RequestKind.TOOL_FOLLOWUP
    perf = Perf(
        outcome="complete",
        cache_n=timings.cache_n,
        prompt_n=timings.prompt_n,
        predicted_n=timings.predicted_n,
        capped=result.capped,
        extra={"scripted_reply": call is not None, "finish_reason": result.assembler.finish_reason},
    )
    record = RequestRecord(kind, turn.slot, epoch, len(messages), messages_digest(messages), perf)
    message = result.assembler.message()
    reply = "scripted" if call is not None else _append_model_reply(turn, message, record)
    if call is not None:
        turn.log.append_assistant(turn.session, call.message, request=record)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return Sent(
        turn=number,
        after=after,
        reply=reply,
        cache_n=timings.cache_n,
        prompt_n=timings.prompt_n,
        predicted_n=timings.predicted_n,
        capped=result.capped,
        finish_reason=result.assembler.finish_reason,
        wall_s=wall,
        cpu_s=cpu,
        body=body,
        reasoning=message.reasoning_content if call is None else "",
    )


def _append_model_reply(turn: Turn, message: AssistantMessage, record: RequestRecord) -> str:
    """Append the model's reply as streamed and answer any tool call it made on its own.

    The tiny model sometimes imitates the scripted calls, and ``max_tokens`` can cut such a
    call off with arguments that are not JSON. The server refuses to render those, so every
    later request would fail: that reply is recorded as broken (kept, never replayed) instead.
    """
    text = dumps(message.to_wire())
    if not all(_is_json(call.arguments) for call in message.tool_calls):
        reason = "a tool call cut off by max_tokens: its arguments are not JSON"
        turn.log.append_broken(turn.session, partial_text=text, reason=reason, request=record)
        return CUT_REPLY
    turn.log.append_assistant(turn.session, text, request=record)
    for tool_call in message.tool_calls:
        turn.log.append_tool_result(
            turn.session, tool_call_id=tool_call.id, content=UNPROMPTED_RESULT
        )
    return "model"


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


# -- the naive client -------------------------------------------------------------------------


async def run_naive(
    url: str,
    s: SessionSettings,
    script: Sequence[UserTurn] = SCRIPT,
    mistakes: frozenset[Mistake] = EVERY_MISTAKE,
) -> list[Sent]:
    sampling = asdict(Sampling(temperature=s.temperature))
    sent: list[Sent] = []
    async with make_async_client(url, connect_s=10.0) as http:
        naive = NaiveHarness(
            http,
            model=s.model,
            system_text=SYSTEM_TEXT,
            tools=TOOLS,
            sampling=sampling,
            mistakes=mistakes,
        )
        for number, user_turn in enumerate(script, start=1):
            naive.add_user(user_turn.text)
            after = "user message"
            for call in user_turn.calls:
                sent.append(await _naive_step(naive, s.scripted_max_tokens, number, after, False))
                naive.add_assistant(json.loads(call.message))
                for call_id, result in zip(call.call_ids, call.results, strict=True):
                    naive.add_tool_result(call_id, result)
                after = "tool result"
            sent.append(await _naive_step(naive, s.max_tokens, number, after, True))
            log.info("naive: turn %d done, %d requests", number, len(sent))
    return sent


async def _naive_step(
    naive: NaiveHarness, max_tokens: int, number: int, after: str, keep_reply: bool
) -> Sent:
    wall = time.perf_counter()
    reply = await naive.complete(max_tokens)
    wall = time.perf_counter() - wall
    if keep_reply:
        for call in naive.add_assistant(reply.message).tool_calls:
            naive.add_tool_result(call.id, UNPROMPTED_RESULT)
    t = reply.timings
    return Sent(
        turn=number,
        after=after,
        reply="model" if keep_reply else "scripted",
        cache_n=int(t.get("cache_n", 0)),
        prompt_n=int(t.get("prompt_n", 0)),
        predicted_n=int(t.get("predicted_n", 0)),
        capped=False,
        finish_reason=reply.finish_reason,
        wall_s=wall,
        cpu_s=0.0,
    )


# -- the ideal and the table ------------------------------------------------------------------


async def rows(
    url: str, model: str, loopd: Sequence[Sent], naive: Sequence[Sent]
) -> list[CacheRow]:
    if len(loopd) != len(naive):
        raise BenchError(f"loopd sent {len(loopd)} requests and the naive client {len(naive)}")
    table: list[CacheRow] = []
    previous: Prompt | None = None
    async with make_async_client(url, connect_s=10.0) as http:
        counter = PromptTokens(http, model)
        for index, (ours, theirs) in enumerate(zip(loopd, naive, strict=True)):
            prompt = await counter.of(ours.body)
            before = loopd[index - 1] if index else None
            carried = before.predicted_n if before is not None and before.reply == "model" else 0
            rendered = before is None or reply_rendered(prompt.text, before.reasoning)
            found = ideal(prompt.tokens, previous.tokens if previous else None, carried, rendered)
            capped = before is not None and before.capped
            retokenized = previous is not None and reply_tokenized_anew(
                len(previous.tokens), carried, ours.cache_n
            )
            before_divergence = (
                resumed_before_divergence(found, len(previous.tokens), retokenized, ours.cache_n)
                if previous is not None
                else 0
            )
            table.append(
                CacheRow(
                    index=index + 1,
                    turn=ours.turn,
                    after=ours.after,
                    reply=ours.reply,
                    prompt_tokens=len(prompt.tokens),
                    ideal=found.new_tokens,
                    loopd_cache_n=ours.cache_n,
                    loopd_prompt_n=ours.prompt_n,
                    naive_cache_n=theirs.cache_n,
                    naive_prompt_n=theirs.prompt_n,
                    label=label(
                        index,
                        found,
                        capped,
                        retokenized,
                        text_kept=previous is not None and prompt.text.startswith(previous.text),
                        before_divergence=before_divergence,
                    ),
                    before_divergence=before_divergence,
                    counted_matches_server=len(prompt.tokens) == ours.cache_n + ours.prompt_n,
                )
            )
            previous = prompt
    return table


async def run(
    url: str,
    state_dir: Path,
    s: SessionSettings = SessionSettings(),
    script: Sequence[UserTurn] = SCRIPT,
) -> CacheResult:
    """The session through loopd, then through the naive client (every mistake at once, then
    each mistake alone where ``s.one_mistake_runs``), then the ideal of each request."""
    loopd = await run_loopd(url, state_dir, s, script)
    naive = await run_naive(url, s, script)
    alone = []
    for mistake in Mistake if s.one_mistake_runs else ():
        log.info("naive, %s only", mistake)
        sent = await run_naive(url, s, script, frozenset({mistake}))
        alone.append(MistakeAlone(mistake, sum(one.prompt_n for one in sent[1:])))
    table = await rows(url, s.model, loopd, naive)
    return CacheResult(table, s, [sent for sent in loopd if sent.reply != "scripted"], tuple(alone))
