"""Thread switching: several sessions sharing one slot, with the server's host prompt cache on.

For 1 (no switching, the control), 2 and 4 sessions on slot 0 of a preset (the plain one, and the
hybrid one on production's layout), each session
first reads its own short report, then the sessions take turns for more rounds. From the second
round on every turn of a shared slot follows another session's turn: a switch. Its cost is what
the server re-read beyond the new tokens (loopd's own cache-loss figure: the reuse an exact
replay should get, less the server's ``cache_n``) and the time before generation began.

Turns go through ``Runtime.run_turn``, loopd's real path (scheduler, turn engine, session log),
so the same turns also give loopd's CPU time as a share of each turn's wall time. Each turn keeps
the cause loopd recorded for its loss and, when the server logs at trace level, what the server
says it did (``bench/serverlog.py``).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.errors import BenchError
from bench.pool import explain
from bench.serverlog import LogFollower, parse
from bench.stats import Spread
from loopcommon.jsonbytes import dumps
from loopd.config import load_settings
from loopd.sessions import Runtime
from loopd_dev.devserver import PLAIN_MODEL

log = logging.getLogger("bench.switching")

# The vocabulary of the reports; a seeded draw per session keeps every run's prompts the same.
_VOCABULARY = (
    "build cache server slot thread prompt token reply parser release branch review test "
    "deploy metric latency budget queue worker schedule invoice customer ticket owner"
)
_WORDS = _VOCABULARY.split()
FOLLOW_UPS = ("Name one risk in it.", "And one next step?", "Who should know?")


@dataclass(frozen=True)
class TurnSample:
    model: str
    sessions: int  # how many sessions share the slot in this run
    session: str
    round: int  # 1 = the session's first turn
    switched: bool  # the slot's previous turn belonged to another session
    cache_n: int
    prompt_n: int
    cache_loss: int
    prompt_phase_s: float  # from sending until generation began
    wall_s: float
    cpu_s: float  # this process's CPU time during the turn
    loopd_cause: str = ""  # the cause loopd recorded for the turn's cache loss
    server_says: str = ""  # what the server logged for the turn's request ("" without a log)


@dataclass(frozen=True)
class SwitchRow:
    model: str
    sessions: int
    turns: int  # turns after each session's first
    switches: int
    cache_loss: Spread
    prompt_n: Spread
    prompt_phase_s: Spread


def report_text(index: int, words: int = 120) -> str:
    """A distinct, deterministic document for session ``index``."""
    rng = random.Random(index)
    body = " ".join(rng.choice(_WORDS) for _ in range(words))
    return f"Report {index}: {body}."


def first_message(index: int) -> str:
    return f"{report_text(index)}\nSummarise report {index} in one sentence."


async def run(
    url: str,
    state_dir: Path,
    counts: Sequence[int] = (1, 2, 4),
    rounds: int = 3,
    max_tokens: int = 16,
    model: str = PLAIN_MODEL,
    server_log: LogFollower | None = None,
    hybrid: bool = False,
) -> list[TurnSample]:
    settings = load_settings(
        infer_url=url,
        model=model,
        state_dir=state_dir,
        workspace_dir=state_dir / "workspaces",
        tools_file=_tools_file(state_dir),
        broker_url=f"unix:{state_dir / 'no-broker.sock'}",
        slots=(0,),
        max_tokens=max_tokens,
        think_cap=0,  # no cap: the plain model does not think, and max_tokens is short
        temperature=0.0,
        system_text="You are a helpful assistant. Answer in one short sentence.",
    )
    runtime = Runtime.open(settings)
    samples: list[TurnSample] = []
    try:
        last_on_slot: str | None = None
        for count in counts:
            names = [f"{model}-share{count}-{index}" for index in range(count)]
            for round_number in range(1, rounds + 1):
                for index, name in enumerate(names):
                    sample = await _turn(
                        runtime, count, name, index, round_number, last_on_slot, server_log, hybrid
                    )
                    samples.append(sample)
                    last_on_slot = name
            log.info("switching: %d session(s) done", count)
    finally:
        await runtime.aclose()
    return samples


def _tools_file(state_dir: Path) -> Path:
    # The plain preset's template has no tool support; one tool keeps the runtime's file valid.
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / "tools.json"
    tool = {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a text file in the workspace.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
    path.write_text(dumps([tool]), encoding="utf-8")
    return path


async def _turn(
    runtime: Runtime,
    count: int,
    name: str,
    index: int,
    round_number: int,
    last: str | None,
    server_log: LogFollower | None,
    hybrid: bool,
) -> TurnSample:
    session = runtime.ensure_session(name)
    text = first_message(index) if round_number == 1 else FOLLOW_UPS[(round_number - 2) % 3]
    runtime.log.append_user(name, text, external_key=f"{name}-{round_number}")
    if server_log is not None:
        server_log.mark()
    wall, cpu = time.perf_counter(), time.process_time()
    outcome = await runtime.run_turn(session, report=lambda status: None)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    if outcome.failure is not None or not outcome.requests:
        raise BenchError(f"a turn of {name} failed: {outcome.failure}")
    perf = outcome.requests[-1].perf
    if perf.cache_n is None or perf.prompt_n is None:
        raise BenchError(f"a turn of {name} has no timings")
    duration_ms = float(perf.extra.get("duration_ms") or 0.0)
    predicted_ms = float(perf.extra.get("predicted_ms") or 0.0)
    server_says = ""
    if server_log is not None:
        # One request per turn here (no tools): its lines end with its slot's release.
        steps = parse(server_log.lines_until_release())
        held = perf.cache_n + (perf.cache_loss or 0)
        server_says = explain(steps, held if round_number > 1 else 0, perf.cache_n, hybrid)
    return TurnSample(
        model=runtime.settings.model,
        sessions=count,
        session=name,
        round=round_number,
        switched=last is not None and last != name,
        cache_n=perf.cache_n,
        prompt_n=perf.prompt_n,
        cache_loss=perf.cache_loss or 0,
        prompt_phase_s=max(duration_ms - predicted_ms, 0.0) / 1000,
        wall_s=wall,
        cpu_s=cpu,
        loopd_cause=perf.cache_loss_cause or "",
        server_says=server_says,
    )


def summarize(samples: Sequence[TurnSample]) -> list[SwitchRow]:
    """One row per model and session count, over the turns after each session's first."""
    table = []
    models = list(dict.fromkeys(sample.model for sample in samples))
    for model, count in [(m, c) for m in models for c in sorted({s.sessions for s in samples})]:
        later = [s for s in samples if s.model == model and s.sessions == count and s.round > 1]
        if not later:
            continue
        table.append(
            SwitchRow(
                model=model,
                sessions=count,
                turns=len(later),
                switches=sum(s.switched for s in later),
                cache_loss=Spread.of([s.cache_loss for s in later]),
                prompt_n=Spread.of([s.prompt_n for s in later]),
                prompt_phase_s=Spread.of([s.prompt_phase_s for s in later]),
            )
        )
    return table
