"""Save when it pays, through loopd (``loopd.engine.saverule``): what durable sessions cost a
warm turn where the rule skips the save, and what a return gains where it saves.

- *Warm turns*: on each preset, one session with ``durable`` on and one with it off, each on a
  router of its own (so neither sees the other's requests), take turns alternately, so that
  both meet the same load on the machine; their models are read in the background, as
  ``loopd serve``'s server watch reads them (so a turn reads nothing before it starts).
  Nothing is forgotten between turns, so the rule's chance of a lost return falls with every
  warm return, and it skips the save once what a return could gain no longer covers what a
  save costs. Measured: each turn's wall time (the
  save included where one was made), the median over the turns whose decision was a skip, on
  against off.
- *A long session after a restart*: on each preset, a session with a long first message
  takes a few warm turns (so the rule's figures are measured), its last decision is recorded,
  the router is killed and started again, and the session returns, as through ``loopd chat``
  (no watch: the turn reads the model before it starts). With ``durable`` on loopd restores
  the save before the request (the model restarted: its process is new); off, the prompt is
  read again. Measured: the return's wait to its first token as the person saw it
  (``loopd.engine.waits``: the restore is inside it) and ``prompt_n``.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio

from bench.durable_loopd import answered, first_message, say, settings_for, start
from loopd.config import SHORTHAND_ENDPOINT
from loopd.engine.pinning import PinSlots
from loopd.engine.waits import person_wait_ms
from loopd.selftest.expected import ServerAnswers
from loopd.sessionlog.records import Request
from loopd.sessions import Runtime
from loopd_dev import devserver

log = logging.getLogger("bench.durable")

PRESETS = (devserver.PLAIN_MODEL, devserver.HYBRID_MODEL)
# The dense preset keeps its slots (pinned, as loopd serve's self-test finds); the hybrid's
# unified pool clears them, so the server places its requests (production's layout).
PINNING = {devserver.PLAIN_MODEL: PinSlots.YES, devserver.HYBRID_MODEL: PinSlots.NO}
WARMUP_TURNS = 30  # warm returns before the measured ones: the rule's chance settles
MEASURED_TURNS = 20
WARM_NOTES = 20  # the warm session's first message: about 500 tokens of notes
# The long session's first message: SmolLM2's slots hold 4,096 tokens, the hybrid's pool 16,384.
LONG_NOTES = {devserver.PLAIN_MODEL: 110, devserver.HYBRID_MODEL: 400}
LONG_WARM_TURNS = 5
NEXT = "Note {n}: and one more thing to keep. Say only 'noted'."
RETURN = "Which day does the deploy window open?"


@dataclass(frozen=True)
class WarmTurns:
    preset: str
    on_ms: list[float]  # the turns with durable on whose decision was a skip
    off_ms: list[float]
    saves: int  # measured turns with durable on whose decision was a save
    last_reason: str

    @property
    def ratio(self) -> float:
        return statistics.median(self.on_ms) / statistics.median(self.off_ms)


@dataclass(frozen=True)
class LongReturn:
    preset: str
    durable: bool
    tokens: int  # the prompt the return held
    decision: str  # the last save decision before the restart ("-" with durable off)
    reason: str
    wait_ms: float  # to the first token, as the person saw it
    prompt_n: int
    restore_ms: float


def _decision(requests: list[Request]) -> dict[str, object]:
    save = answered(requests).record.perf.extra.get("save")
    return save if isinstance(save, dict) else {}


@contextmanager
def _router(work: Path, cache_dir: Path, model: str) -> Iterator[devserver.RunningServer]:
    (work / "saves").mkdir(parents=True, exist_ok=True)
    server = start(work, cache_dir, model)
    try:
        yield server
    finally:
        server.stop()


def _runtime(url: str, model: str, state: Path, durable: bool, *, watched: bool) -> Runtime:
    settings = settings_for(url, model, state, durable, PINNING[model])
    # What ``loopd serve``'s self-test tells it (the slot pool probe, the save probe); and,
    # ``watched``, that a watch reads the model in the background, as ``loopd serve``'s does
    # (a turn then does not read it before it starts; unwatched, as in ``loopd chat``, it does).
    found = ServerAnswers(
        idle_slots_cleared=model == devserver.HYBRID_MODEL, durable_available=durable
    )
    runtime = Runtime.open(
        settings.model_copy(update={"slots": (0,)}), selftest={SHORTHAND_ENDPOINT: found}
    )
    runtime.endpoints.servers[SHORTHAND_ENDPOINT].memory.watched = watched
    return runtime


async def _timed(runtime: Runtime, text: str) -> tuple[float, list[Request]]:
    started = time.monotonic()
    requests = await say(runtime, "warm", text)
    return (time.monotonic() - started) * 1000, requests


def warm_turns(work: Path, cache_dir: Path, model: str) -> WarmTurns:
    with (
        _router(work / "on", cache_dir, model) as on_server,
        _router(work / "off", cache_dir, model) as off_server,
    ):

        async def turns() -> WarmTurns:
            on = _runtime(on_server.url, model, work / "on" / "state", True, watched=True)
            off = _runtime(off_server.url, model, work / "off" / "state", False, watched=True)
            on_ms: list[float] = []
            off_ms: list[float] = []
            saves, reason = 0, ""
            try:
                for runtime in (on, off):
                    await say(runtime, "warm", first_message("warm", WARM_NOTES))
                for n in range(WARMUP_TURNS + MEASURED_TURNS):
                    text = NEXT.format(n=n)
                    on_turn, requests = await _timed(on, text)
                    off_turn, _ = await _timed(off, text)
                    if n < WARMUP_TURNS:
                        continue
                    decision = _decision(requests)
                    reason = str(decision.get("reason", ""))
                    if decision.get("decision") == "skip":
                        on_ms.append(on_turn)
                        off_ms.append(off_turn)
                    else:
                        saves += 1
            finally:
                await on.aclose()
                await off.aclose()
            return WarmTurns(model, on_ms, off_ms, saves, reason)

        return anyio.run(turns)


def long_return(work: Path, cache_dir: Path, model: str, durable: bool) -> LongReturn:
    (work / "saves").mkdir(parents=True, exist_ok=True)
    servers = [start(work, cache_dir, model)]

    async def session() -> LongReturn:
        runtime = _runtime(servers[0].url, model, work / "state", durable, watched=False)
        try:
            await say(runtime, "long", first_message("long", LONG_NOTES[model]))
            last: list[Request] = []
            for n in range(LONG_WARM_TURNS):
                last = await say(runtime, "long", NEXT.format(n=n))
            decision = _decision(last) if durable else {}
            servers[0].kill()
            servers[0] = start(work, cache_dir, model)
            perf = answered(await say(runtime, "long", RETURN)).record.perf
        finally:
            await runtime.aclose()
        restore = perf.extra.get("restore")
        restore_ms = restore.get("restore_ms", 0.0) if isinstance(restore, dict) else 0.0
        return LongReturn(
            preset=model,
            durable=durable,
            tokens=(perf.cache_n or 0) + (perf.prompt_n or 0),
            decision=str(decision.get("decision", "-")),
            reason=str(decision.get("reason", "")),
            wait_ms=person_wait_ms(perf.extra) or 0.0,
            prompt_n=perf.prompt_n or 0,
            restore_ms=float(restore_ms),
        )

    try:
        return anyio.run(session)
    finally:
        servers[0].stop()


@dataclass(frozen=True)
class RuleRun:
    warm: list[WarmTurns]
    long: list[LongReturn]


def run(work: Path, cache_dir: Path) -> RuleRun:
    warm = []
    long = []
    for model in PRESETS:
        log.info("the save rule: warm turns of %s", model)
        warm.append(warm_turns(work / f"warm-{model}", cache_dir, model))
        for durable in (True, False):
            log.info("the save rule: a long session of %s, durable %s", model, durable)
            long.append(long_return(work / f"long-{model}-{durable}", cache_dir, model, durable))
    return RuleRun(warm, long)


def render(run: RuleRun) -> str:
    lines = [
        "### Through loopd: save when it pays",
        "",
        f"*Warm turns*: on each preset one session with `durable` on and one with it off, each on "
        f"a router of its own, take turns alternately ({WARMUP_TURNS} warm-up turns, then "
        f"{MEASURED_TURNS} measured); nothing is forgotten, so the rule's chance of a lost "
        "return falls with each warm return. The medians compare the turns whose decision was "
        "a skip, each with the off session's turn that followed it.",
        "",
        "| Preset | Turns skipped (measured) | Saves made (measured) | Median turn, on | "
        "Median turn, off | on / off | The rule's last reason |",
        "|---|---|---|---|---|---|---|",
    ]
    for w in run.warm:
        ratio = f"{w.ratio:.3f}" if w.on_ms else "-"
        on = f"{statistics.median(w.on_ms):.1f} ms" if w.on_ms else "-"
        off = f"{statistics.median(w.off_ms):.1f} ms" if w.off_ms else "-"
        lines.append(
            f"| {w.preset} | {len(w.on_ms)} | {w.saves} | {on} | {off} | {ratio} "
            f"| {w.last_reason} |"
        )
    lines += [
        "",
        f"*A long session after a restart*: a long first message, {LONG_WARM_TURNS} warm turns "
        "(the rule's figures measured), the router killed and started again, and the return. "
        "With `durable` on loopd read the model before the turn (its process is new), restored "
        "the save and sent the request once; off, the prompt is read again. *Wait* is the "
        "person's wait to the first token, the restore inside it.",
        "",
        "| Preset | durable | Prompt (tokens) | The rule's last decision | Wait to the first "
        "token | of which restore | prompt_n |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in run.long:
        lines.append(
            f"| {r.preset} | {'on' if r.durable else 'off'} | {r.tokens} | {r.decision} "
            f"| {r.wait_ms:.0f} ms | {r.restore_ms:.1f} ms | {r.prompt_n} |"
        )
    reasons = [f"- {r.preset}: {r.reason}" for r in run.long if r.durable and r.reason]
    if reasons:
        lines += ["", "The rule's reasons for those decisions:", "", *reasons]
    return "\n".join(lines) + "\n"
