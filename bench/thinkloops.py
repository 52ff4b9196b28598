"""Thinking loops ended early: the repetition watch (``LOOPD_LOOP_WINDOW``, ``loopd.engine.loops``)
on the tiny thinking preset (``smollm2-think``), which loops readily.

A dozen short questions, each one turn through loopd's engine, twice: with the watch (the
default window) and without it (0), both under a thinking cap of 1,024 tokens (below
``max_tokens`` 2,048, as the settings' rule wants) and at temperature 0, so the two runs of a
question read the same stream until the watch acts. For each run: the GPU seconds of the turn
(the server's ``prompt_ms`` + ``predicted_ms``), its thinking tokens, and how the thought ended
(by itself, at the cap, or by the watch). A false alarm is a question whose thought, without the
watch, ended by itself before the cap, and which the watch ended.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import anyio

from bench.realtools import gpu_s
from loopd.config import load_settings
from loopd.engine.outcome import TurnOutcome
from loopd.sessionlog.records import fresh_external_key
from loopd.sessions import Runtime
from loopd_dev import devserver

log = logging.getLogger("bench.thinkloops")

QUESTIONS = (
    "What is 17 times 23?",
    "Name three prime numbers above 50.",
    "Explain in two sentences why the sky is blue.",
    "Write a haiku about rain.",
    "Is 91 a prime number?",
    "What day comes after Tuesday?",
    "Sort these words: pear, apple, fig.",
    "How many legs do three spiders have?",
    "What is the capital of Australia?",
    "Translate 'good morning' into French.",
    "How many letters are in the word banana?",
    "A train leaves at 3 pm and travels for 2 hours. When does it arrive?",
)
THINK_CAP = 1024
MAX_TOKENS = 2048
WINDOW = load_settings(model="m").loop_window  # the shipped default


@dataclass(frozen=True)
class Turned:
    gpu_s: float
    thinking: int
    ended: str  # how the thought ended: "itself", "cap" or "watch"
    answer_closed: bool  # the watch closed a looping answer
    cut: bool  # the answer ran to max_tokens

    @property
    def calm(self) -> bool:
        """Nothing looped: the thought ended by itself and the answer before max_tokens."""
        return self.ended == "itself" and not self.cut and not self.answer_closed

    @property
    def shown(self) -> str:
        closed = ", answer closed" if self.answer_closed else ""
        return self.ended + closed + (", answer cut at max_tokens" if self.cut else "")


@dataclass(frozen=True)
class Question:
    text: str
    with_watch: Turned
    without: Turned

    @property
    def false_alarm(self) -> bool:
        """The watch acted on a turn that, without it, looped nowhere."""
        fired = self.with_watch.ended == "watch" or self.with_watch.answer_closed
        return self.without.calm and fired


@dataclass(frozen=True)
class ThinkLoops:
    model: str
    questions: list[Question]


def run(work: Path, cache_dir: Path) -> ThinkLoops:
    log.info("thinking loops: %d questions on %s", len(QUESTIONS), devserver.THINKING_MODEL)
    with devserver.running(
        work / "server",
        cache_dir,
        socket_path=work / "llama.sock",
        load=(devserver.THINKING_MODEL,),
    ) as server:
        return anyio.run(_measure, server.url, work)


async def _measure(url: str, work: Path) -> ThinkLoops:
    # One turn first, not counted: the system text and the tools are then in the server's
    # cache for both runs of every question, not only for the second one.
    await _turn(url, work / "warm", "warm", "Say hello.", WINDOW)
    questions = []
    for n, text in enumerate(QUESTIONS):
        # Each run's user message is new to the server, bar the first's in the second: which
        # run goes first alternates, so neither is always the one read from the cache.
        if n % 2:
            without = await _turn(url, work / "without", f"q{n}", text, 0)
            with_watch = await _turn(url, work / "with", f"q{n}", text, WINDOW)
        else:
            with_watch = await _turn(url, work / "with", f"q{n}", text, WINDOW)
            without = await _turn(url, work / "without", f"q{n}", text, 0)
        questions.append(Question(text, with_watch, without))
        log.info(
            "%s: with the watch %.1f GPU s (%s), without %.1f GPU s (%s)",
            text,
            with_watch.gpu_s,
            with_watch.shown,
            without.gpu_s,
            without.shown,
        )
    return ThinkLoops(devserver.THINKING_MODEL, questions)


async def _turn(url: str, state: Path, session: str, text: str, window: int) -> Turned:
    settings = load_settings(
        infer_url=url,
        model=devserver.THINKING_MODEL,
        state_dir=state,
        broker_url="unix:/nonexistent",
        temperature=0.0,
        max_tokens=MAX_TOKENS,
        think_cap=THINK_CAP,
        loop_window=window,
    )
    runtime = Runtime.open(settings)
    try:
        found = runtime.ensure_session(session)
        runtime.log.append_user(session, text, external_key=fresh_external_key())
        outcome = await runtime.run_turn(found, lambda status: None)
    finally:
        await runtime.aclose()
    closed = any("answer" in r.perf.extra.get("looped", ()) for r in outcome.requests)
    cut = outcome.cut_at is not None
    return Turned(gpu_s(outcome.requests), _thinking(outcome), _ended(outcome), closed, cut)


def _thinking(outcome: TurnOutcome) -> int:
    return sum(r.perf.thinking_tokens or 0 for r in outcome.requests)


def _ended(outcome: TurnOutcome) -> str:
    extras = [r.perf.extra for r in outcome.requests]
    if any("reasoning" in extra.get("looped", ()) for extra in extras):
        return "watch"
    if any(r.perf.capped for r in outcome.requests):
        return "cap"
    return "itself"


def render(result: ThinkLoops) -> str:
    qs = result.questions
    looped = [q for q in qs if q.without.ended == "cap"]
    calm = [q for q in qs if q.without.calm]
    caught = [q for q in looped if q.with_watch.ended == "watch"]
    alarms = [q for q in qs if q.false_alarm]
    closed = [q for q in qs if q.with_watch.answer_closed]
    lines = [
        f"## Thinking loops ended early ({result.model}, `LOOPD_LOOP_WINDOW` {WINDOW} against 0)",
        "",
        f"Each question one turn at temperature 0, thinking cap {THINK_CAP}, `max_tokens` "
        f"{MAX_TOKENS}; GPU s is the server's `prompt_ms` + `predicted_ms` of the turn.",
        "",
        "| Question | GPU s with the watch | thinking tokens | ended by | GPU s without "
        "| thinking tokens | ended by |",
        "|---|---|---|---|---|---|---|",
    ]
    for q in qs:
        w, o = q.with_watch, q.without
        lines.append(
            f"| {q.text} | {w.gpu_s:.1f} | {w.thinking} | {w.shown} | {o.gpu_s:.1f} "
            f"| {o.thinking} | {o.shown} |"
        )
    total_with = sum(q.with_watch.gpu_s for q in qs)
    total_without = sum(q.without.gpu_s for q in qs)
    lines += [
        f"| all | {total_with:.1f} | {sum(q.with_watch.thinking for q in qs)} | "
        f"| {total_without:.1f} | {sum(q.without.thinking for q in qs)} | |",
        "",
        f"Without the watch {len(looped)} of {len(qs)} thoughts ran to the cap; the watch ended "
        f"{len(caught)} of them early, and closed {len(closed)} looping answers. GPU seconds "
        f"per turn: {total_with / len(qs):.2f} with the watch, {total_without / len(qs):.2f} "
        "without. False alarms (the watch acting on a turn that looped nowhere without it): "
        f"{len(alarms)} of {len(calm)}.",
    ]
    return "\n".join(lines) + "\n"
