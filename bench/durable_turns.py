"""Durable sessions through loopd with more threads than the host prompt cache holds: twenty
sessions of about 2,000 tokens of their own (beside the system text and tools all share) take
turns on a server of two slots whose host cache (``cache-ram``) holds only a few of them, with
``durable`` off and on, side by side in one run.

The server places the requests (production's layout: a unified pool that clears idle slots into
the host cache, ``loopd.engine.pinning``), so between two turns of a session eighteen others
ran, and its prompt survives only in the host cache, which has long evicted it. With ``durable``
on, loopd saved each answered turn's state; a return's first progress event shows the server
holds little of the session, and loopd restores the save into an idle slot and sends the
request naming that slot.

Measured on every return (each session's turns after its first), by the answered request's own
perf record: *held before*, what loopd expected the server to keep (``expected_reuse``: the
previous request's prompt and reply); *re-read*, the part of it the server read again
(``expected_reuse - cache_n``); the share re-read is their sums' ratio.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import anyio

from bench.durable_loopd import answered, first_message, say, settings_for, start
from loopd.config import SHORTHAND_ENDPOINT
from loopd.engine.pinning import PinSlots
from loopd.selftest.expected import ServerAnswers
from loopd.sessions import Runtime
from loopd_dev import devserver

log = logging.getLogger("bench.durable")

MODEL = "qwen35moe-two-slots"
SESSIONS = 20
NOTES = 44  # about 2,000 tokens of notes in each session's first message
ROUNDS = 3  # each session's turns: the first, then two returns
# The host cache: a few of the sessions' states (about 2.5 MB each on this preset) fit.
CACHE_RAM_MIB = 8
# The hybrid preset (tokens are read fast enough for sixty turns twice) on two slots of one
# unified pool, as production lays its slots out; a pool large enough that loopd's input cap
# (a share of it) never cuts a first message.
LAYOUT = devserver.SlotLayout(ctx_size=65536, parallel=2, kv_unified=True)


@dataclass(frozen=True)
class TurnsReturn:
    durable: bool
    held_before: int  # expected_reuse
    cache_n: int
    prompt_n: int
    cause: str
    wall_ms: float  # the whole turn: a closed request, a restore, the answer, the save

    @property
    def re_read(self) -> int:
        return max(self.held_before - self.cache_n, 0)


def two_slots(work: Path, cache_dir: Path) -> devserver.Preset:
    """The hybrid preset on ``LAYOUT`` with the small host cache."""
    prov = devserver.Provisioned.in_cache(cache_dir)
    every_turn = work / devserver.EVERY_TURN_TEMPLATE
    every_turn.write_text(
        devserver.every_turn_reasoning(
            (prov.templates / devserver.THINKING_TEMPLATE).read_text(encoding="utf-8")
        ),
        encoding="utf-8",
    )
    return devserver.hybrid_preset(
        prov, every_turn, name=MODEL, layout=LAYOUT, extra=(("cache-ram", str(CACHE_RAM_MIB)),)
    )


def one_run(work: Path, cache_dir: Path, durable: bool) -> list[TurnsReturn]:
    work.mkdir(parents=True, exist_ok=True)
    (work / "saves").mkdir(exist_ok=True)
    server = start(work, cache_dir, MODEL, (two_slots(work, cache_dir),))
    settings = settings_for(server.url, MODEL, work / "state", durable, PinSlots.NO)
    names = [f"thread-{n:02d}" for n in range(SESSIONS)]

    async def turns() -> list[TurnsReturn]:
        # What ``loopd serve``'s self-test finds on this pool.
        found = ServerAnswers(idle_slots_cleared=True, durable_available=durable)
        runtime = Runtime.open(settings, selftest={SHORTHAND_ENDPOINT: found})
        returns: list[TurnsReturn] = []
        try:
            for name in names:
                await say(runtime, name, first_message(name, NOTES))
            for round_ in range(1, ROUNDS):
                for name in names:
                    started = time.monotonic()
                    requests = await say(runtime, name, f"Round {round_}: which day is it?")
                    wall_ms = (time.monotonic() - started) * 1000
                    perf = answered(requests).record.perf
                    returns.append(
                        TurnsReturn(
                            durable=durable,
                            held_before=int(perf.extra.get("expected_reuse", 0)),
                            cache_n=perf.cache_n or 0,
                            prompt_n=perf.prompt_n or 0,
                            cause=perf.cache_loss_cause or "",
                            wall_ms=wall_ms,
                        )
                    )
        finally:
            await runtime.aclose()
        return returns

    try:
        return anyio.run(turns)
    finally:
        server.stop()


def run(work: Path, cache_dir: Path) -> list[TurnsReturn]:
    returns = []
    for durable in (False, True):
        log.info("durable, many threads: durable %s", "on" if durable else "off")
        returns += one_run(work / f"turns-{durable}", cache_dir, durable)
    return returns


def render(returns: list[TurnsReturn]) -> str:
    lines = [
        "### Through loopd: more threads than the host cache holds",
        "",
        f"{SESSIONS} sessions, each opening with about 2,000 tokens of its own (beside the "
        f"system text and tools they share), take turns ({ROUNDS} turns "
        f"each) on `{MODEL}`: the hybrid preset on {LAYOUT.parallel} slots of one unified pool "
        f"({LAYOUT.ctx_size} tokens), `cache-ram` {CACHE_RAM_MIB} MiB; requests placed by the "
        "server. Each row sums the returns (every turn after a session's first): *held before* "
        "is what loopd expected the server to keep, *re-read* what of it the server read again; "
        "*mean turn* is a whole turn's wall time, with `durable` on its closed request, restore, "
        "and the prefix read and save at its end too (on this tiny model, round trips that cost "
        "more than reading its 2,000 tokens again).",
        "",
        "| durable | Returns | Held before (tokens) | Re-read (tokens) | Share re-read "
        "| prompt_n | Mean turn (ms) | Causes recorded |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for durable in (False, True):
        mine = [r for r in returns if r.durable is durable]
        if not mine:
            continue
        held = sum(r.held_before for r in mine)
        re_read = sum(r.re_read for r in mine)
        causes: dict[str, int] = {}
        for r in mine:
            causes[r.cause or "none"] = causes.get(r.cause or "none", 0) + 1
        named = ", ".join(f"{cause} {n}" for cause, n in sorted(causes.items()))
        lines.append(
            f"| {'on' if durable else 'off'} | {len(mine)} | {held:,} | {re_read:,} "
            f"| {re_read / max(held, 1):.1%} | {sum(r.prompt_n for r in mine):,} "
            f"| {sum(r.wall_ms for r in mine) / len(mine):.0f} | {named} |"
        )
    return "\n".join(lines) + "\n"
