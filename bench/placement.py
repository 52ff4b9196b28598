"""Placement across endpoints: N threads on one and on two llama-servers, and one server lost.

loopd itself runs the turns (``Runtime`` with ``[[endpoint]]`` tables, ``loopd.endpoints``), on
two tiny real servers of this machine (the dev server's plain SmolLM2 preset, two slots each, on
Unix sockets). Four runs, each with sessions of its own (their texts name the run, so no run
reads another's cache):

- *1 endpoint*: N threads, each T turns in a row, all the threads at once, on server ``a``;
- *2 endpoints*: the same on ``a`` and ``b``: placement spreads the new sessions;
- *2 endpoints, a killed*: as the second, and server ``a`` SIGKILLed (its process group, as a
  crashed box goes) once every thread has half of its turns answered. Its sessions move to
  ``b``;
- *2 endpoints, a killed, prewarm after the move*: ``LOOPD_PREWARM`` on, ``a`` started afresh;
  every thread's first two turns, ``a`` killed, one turn of an ``a`` session (it finds ``a``
  dead and moves by its own turn), the other ``a`` session moved at once and prewarmed on ``b``
  while ``b`` is idle, then the remaining turns. For each moved session: the request that
  re-read its prompt on ``b`` (``endpoint lost``: its turn, or the prewarm) and what each of its
  turns there re-read afterwards (none, when the session starts warm).

Per run: loopd's queue wait per turn (the turn's time less its requests' own time: waiting for a
slot behind another session), the tokens the server read per turn (``prompt_n``, past its
cache) and those of them it had cached before (``cache_loss``: re-read). For the lost server:
the requests recorded ``endpoint lost``, the tokens they re-read, and the turns delayed (those
whose requests include one that found ``a`` dead), with their extra time.

``python -m bench.placement`` runs only this and appends its section to
``bench/results/<date>.md``; ``make bench`` runs it with the others.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import anyio

from bench.errors import BenchError
from loopd.config import load_settings
from loopd.engine.cacheloss import LossCause
from loopd.prewarm.prewarmer import PrewarmOutcome, PrewarmResult
from loopd.sessionlog.records import Request, RequestKind, fresh_external_key
from loopd.sessions import Runtime
from loopd_dev import devserver

log = logging.getLogger("bench.placement")

THREADS = 4
TURNS = 4
MAX_TOKENS = 16
RESULTS = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class TurnSample:
    session: str
    wall_s: float
    requests: tuple[Request, ...]

    @property
    def queue_wait_s(self) -> float:
        """The turn's time not spent in its own requests: waiting for its slot."""
        own = sum(float(r.record.perf.extra.get("duration_ms") or 0.0) for r in self.requests)
        return max(self.wall_s - own / 1000, 0.0)

    @property
    def found_dead(self) -> bool:
        return any(r.record.perf.extra.get("failure") == "unreachable" for r in self.requests)


@dataclass(frozen=True)
class MovedSession:
    """A session of the killed server, after the move: its one re-read and its turns after."""

    session: str
    reread_by: str  # the request kind that re-read its prompt on the new endpoint
    reread_tokens: int
    turns_after: tuple[Request, ...]  # its turns' requests on the new endpoint, after the re-read

    def reread_after(self) -> list[int]:
        return [r.record.perf.cache_loss or 0 for r in self.turns_after]


@dataclass(frozen=True)
class PlacementRun:
    label: str
    endpoints: int
    threads: int
    turns: list[TurnSample]
    wall_s: float
    spread: dict[str, int]  # endpoint -> sessions whose latest request ran there
    moved: tuple[MovedSession, ...] = ()  # the killed server's sessions, after their move

    def _perfs(self) -> list[Request]:
        return [r for t in self.turns for r in t.requests]

    def queue_wait(self) -> tuple[float, float]:
        waits = [t.queue_wait_s for t in self.turns]
        return statistics.median(waits), max(waits)

    def read_per_turn(self) -> float:
        return sum(r.record.perf.prompt_n or 0 for r in self._perfs()) / len(self.turns)

    def reread_per_turn(self) -> float:
        return sum(r.record.perf.cache_loss or 0 for r in self._perfs()) / len(self.turns)

    def lost(self) -> list[Request]:
        return [
            r for r in self._perfs() if r.record.perf.cache_loss_cause == LossCause.ENDPOINT_LOST
        ]

    def delayed(self) -> tuple[int, float]:
        """Turns that found the dead server, and their median extra time over the others."""
        hit = [t.wall_s for t in self.turns if t.found_dead]
        rest = [t.wall_s for t in self.turns if not t.found_dead]
        if not hit or not rest:
            return len(hit), 0.0
        return len(hit), statistics.median(hit) - statistics.median(rest)


def _message(run: str, thread: int, turn: int) -> str:
    return (
        f"Run {run}, thread {thread}, message {turn}: tell me one short fact about the number "
        f"{thread * 10 + turn}. Answer in one sentence."
    )


async def _one_run(
    label: str,
    servers: dict[str, devserver.RunningServer],
    state: Path,
    kill: str | None = None,
) -> PlacementRun:
    tables = [
        {"name": name, "url": server.url, "model": devserver.PLAIN_MODEL, "slots": (0, 1)}
        for name, server in servers.items()
    ]
    settings = load_settings(
        endpoint=tables, state_dir=state, temperature=0.0, max_tokens=MAX_TOKENS, think_cap=0
    )
    runtime = Runtime.open(settings)
    samples: list[TurnSample] = []
    halfway = anyio.Event()
    at_half = 0
    tag = state.name  # the run's own session names

    async def thread(number: int) -> None:
        nonlocal at_half
        name = f"{tag}-t{number}"
        session = runtime.ensure_session(name)
        for turn in range(TURNS):
            if kill is not None and turn == TURNS // 2:
                # Every thread has its later half of the turns after the kill, however fast
                # its server answered the first half.
                at_half += 1
                if at_half == THREADS:
                    log.info("%s: killing server %s", label, kill)
                    servers[kill].kill()
                    halfway.set()
                await halfway.wait()
            runtime.log.append_user(
                name, _message(label, number, turn), external_key=fresh_external_key()
            )
            before = len(runtime.log.requests(name))
            started = time.monotonic()
            outcome = await runtime.run_turn(session, lambda status: None)
            wall = time.monotonic() - started
            if outcome.answer is None:
                raise BenchError(f"{label}: {name} turn {turn} failed: {outcome.failure}")
            samples.append(TurnSample(name, wall, tuple(runtime.log.requests(name)[before:])))

    started = time.monotonic()
    try:
        async with anyio.create_task_group() as tg:
            for number in range(THREADS):
                tg.start_soon(thread, number)
        spread = _spread(runtime)
        moved = _moved_sessions(runtime)
    finally:
        await runtime.aclose()
    wall_s = time.monotonic() - started
    return PlacementRun(label, len(servers), THREADS, samples, wall_s, spread, moved)


PREWARM_LABEL = "2 endpoints, a killed, prewarm after the move"


async def _prewarm_run(servers: dict[str, devserver.RunningServer], state: Path) -> PlacementRun:
    """LOOPD_PREWARM on: every thread's first two turns at once; server ``a`` killed; one turn
    of an ``a`` session finds it dead (it moves by its own turn, re-reading there); the other
    ``a`` session, idle, moves at once and is prewarmed on ``b`` while ``b`` is idle; then every
    thread's last two turns at once."""
    tables = [
        {"name": name, "url": server.url, "model": devserver.PLAIN_MODEL, "slots": (0, 1)}
        for name, server in servers.items()
    ]
    settings = load_settings(
        endpoint=tables,
        state_dir=state,
        temperature=0.0,
        max_tokens=MAX_TOKENS,
        think_cap=0,
        prewarm=True,
    )
    runtime = Runtime.open(settings)
    assert runtime.endpoints is not None
    warmed = anyio.Event()

    def on_warmed(name: str, result: PrewarmResult) -> None:
        if result.outcome is PrewarmOutcome.DONE:
            warmed.set()

    runtime.endpoints.on_warmed(on_warmed)
    names = [f"{state.name}-t{number}" for number in range(THREADS)]
    samples: list[TurnSample] = []

    async def turn(number: int, index: int) -> None:
        name = names[number]
        session = runtime.ensure_session(name)
        text = _message(PREWARM_LABEL, number, index)
        runtime.log.append_user(name, text, external_key=fresh_external_key())
        before = len(runtime.log.requests(name))
        started = time.monotonic()
        outcome = await runtime.run_turn(session, lambda status: None)
        wall = time.monotonic() - started
        if outcome.answer is None:
            raise BenchError(f"{PREWARM_LABEL}: {name} turn {index} failed: {outcome.failure}")
        samples.append(TurnSample(name, wall, tuple(runtime.log.requests(name)[before:])))

    async def all_threads(index: int) -> None:
        async with anyio.create_task_group() as tg:
            for number in range(THREADS):
                tg.start_soon(turn, number, index)

    started = time.monotonic()
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(runtime.keep_warm, names)
            await all_threads(0)
            await all_threads(1)
            on_a = [n for n, (where, _) in runtime.log.last_endpoints().items() if where == "a"]
            log.info("%s: killing server a (sessions %s)", PREWARM_LABEL, ", ".join(on_a))
            servers["a"].kill()
            first = names.index(sorted(on_a)[0])
            await turn(first, 2)  # finds a dead: a is marked down, its idle sessions move
            with anyio.fail_after(600):
                await warmed.wait()
            for number in range(THREADS):
                if number != first:
                    await turn(number, 2)
            await all_threads(3)
            tg.cancel_scope.cancel()
        spread = _spread(runtime)
        moved = _moved_sessions(runtime)
    finally:
        await runtime.aclose()
    wall_s = time.monotonic() - started
    return PlacementRun(PREWARM_LABEL, len(servers), THREADS, samples, wall_s, spread, moved)


def _spread(runtime: Runtime) -> dict[str, int]:
    spread: dict[str, int] = {}
    for where, _ in runtime.log.last_endpoints().values():
        spread[where] = spread.get(where, 0) + 1
    return spread


def _moved_sessions(runtime: Runtime) -> tuple[MovedSession, ...]:
    """Each session with an ``endpoint lost`` request: that re-read, and its turns after."""
    found = []
    for session in runtime.log.sessions():
        requests = runtime.log.requests(session.name)
        if any(r.record.perf.cache_loss_cause == LossCause.ENDPOINT_LOST for r in requests):
            found.append(_moved(session.name, requests))
    return tuple(found)


def _moved(name: str, requests: Sequence[Request]) -> MovedSession:
    at = next(
        i
        for i, r in enumerate(requests)
        if r.record.perf.cache_loss_cause == LossCause.ENDPOINT_LOST
    )
    reread = requests[at]
    after = tuple(
        r
        for r in requests[at + 1 :]
        if r.record.kind is RequestKind.TURN and r.record.perf.outcome == "complete"
    )
    return MovedSession(name, reread.record.kind.value, reread.record.perf.cache_loss or 0, after)


def run(work: Path, cache_dir: Path) -> list[PlacementRun]:
    """The three runs, on two routers of their own started under ``work``."""
    servers: dict[str, devserver.RunningServer] = {}
    try:
        for name in ("a", "b"):
            folder = work / name
            servers[name] = devserver.start(folder, cache_dir, socket_path=folder / "llama.sock")
        runs = [
            anyio.run(_one_run, "1 endpoint", {"a": servers["a"]}, work / "one"),
            anyio.run(_one_run, "2 endpoints", servers, work / "two"),
            anyio.run(_one_run, "2 endpoints, a killed", servers, work / "killed", "a"),
        ]
        folder = work / "a"  # a again, started afresh, for the run with prewarm after the move
        servers["a"] = devserver.start(folder, cache_dir, socket_path=folder / "llama.sock")
        runs.append(anyio.run(_prewarm_run, servers, work / "prewarm"))
    finally:
        for server in servers.values():
            server.stop()
    return runs


def section(runs: Sequence[PlacementRun], date: str) -> list[str]:
    """The Markdown section of the report."""
    lines = [
        "## Placement across endpoints",
        "",
        f"Measured {date} by `{COMMAND}` (or `make bench`): bench/placement.py. loopd runs "
        f"{THREADS} threads of {TURNS} turns each, all at once, on two real llama-servers of "
        f"this machine (build {devserver.LLAMA_BUILD}, `{devserver.PLAIN_MODEL}`, 2 slots each, "
        f"Unix sockets; `max_tokens` {MAX_TOKENS}, temperature 0). Queue wait: the turn's time "
        "less its requests' own (waiting behind another session for a slot). Read: tokens the "
        "server read past its cache (`prompt_n`); re-read: those it had cached before "
        "(`cache_loss`); in the run that loses a server, the waits between the attempts that find "
        "it dead count as queue wait too. Times depend on the machine's load, and the two servers "
        "share its CPUs, so a run's time does not halve with two; token counts are exact.",
        "",
    ]
    rows = []
    for r in runs:
        median, worst = r.queue_wait()
        where = ", ".join(f"{name}: {count}" for name, count in sorted(r.spread.items()))
        rows.append(
            (
                r.label,
                len(r.turns),
                where,
                f"{median:.2f} / {worst:.2f}",
                f"{r.read_per_turn():.1f}",
                f"{r.reread_per_turn():.1f}",
                f"{r.wall_s:.1f}",
            )
        )
    lines += _table(
        [
            "Run",
            "Turns",
            "Sessions by endpoint (at the end)",
            "Queue wait per turn, s (median / max)",
            "Read tokens per turn",
            "Re-read tokens per turn",
            "Run, s",
        ],
        rows,
    )
    for r in runs:
        lost = r.lost()
        if "killed" not in r.label:
            continue
        lines += ["", *_moved_lines(r)]
        delayed, extra = r.delayed()
        # A prewarm's re-read is no turn's: it ran while the endpoint was idle.
        prewarmed = [m for m in r.moved if m.reread_by == RequestKind.PREWARM.value]
        moved = sorted(
            {t.session for t in r.turns for q in t.requests if q in lost}
            | {m.session for m in prewarmed}
        )
        reread = sum(q.record.perf.cache_loss or 0 for q in lost)
        reread += sum(m.reread_tokens for m in prewarmed)
        by_prewarm = f", {len(prewarmed)} of them by a prewarm" if prewarmed else ""
        lines += [
            "",
            f"Losing an endpoint ({r.label}): {len(lost) + len(prewarmed)} requests recorded "
            f"`endpoint lost` ({', '.join(moved) or 'none'}; one per session that moved"
            f"{by_prewarm}), re-reading {reread:,} tokens the lost server had "
            f"cached; {delayed} turn(s) delayed by finding the server dead (its requests' "
            f"attempts, then the move), by {extra:.1f} s (median) over the other turns. No turn "
            "failed: every message was answered once.",
        ]
    return lines


def _moved_lines(r: PlacementRun) -> list[str]:
    """Each moved session of a run: what re-read its prompt, and what its turns after re-read."""
    lines = [
        f"After the move ({r.label}): each session of the killed server, the request that re-read "
        "its prompt on the other endpoint (`endpoint lost`) and the tokens each of its turns "
        "there re-read afterwards (`cache_loss`):",
        "",
    ]
    rows = [
        (
            m.session,
            m.reread_by,
            f"{m.reread_tokens:,}",
            ", ".join(str(n) for n in m.reread_after()) or "-",
        )
        for m in r.moved
    ]
    return lines + _table(
        ["Session", "Re-read by", "Re-read tokens", "Re-read by each turn after"], rows
    )


COMMAND = "python -m bench.placement"


def _table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines.extend("| " + " | ".join(str(cell) for cell in row) + " |" for row in rows)
    return lines


def main(argv: list[str] | None = None) -> int:
    """Run only this benchmark and append its section to the day's report."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("loopd").setLevel(logging.ERROR)
    parser = argparse.ArgumentParser(prog="python -m bench.placement", description=__doc__)
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for the report")
    parser.add_argument("--cache-dir", type=Path, default=devserver.default_cache_dir())
    args = parser.parse_args(argv)
    date = datetime.now().strftime("%Y-%m-%d")
    try:
        with tempfile.TemporaryDirectory(prefix="bpl") as tmp:
            runs = run(Path(tmp), args.cache_dir)
    except (devserver.DevServerError, BenchError) as exc:
        sys.stderr.write(f"bench failed: {exc}\n")
        return 2
    path: Path = args.out / f"{date}.md"
    before = path.read_text(encoding="utf-8") if path.exists() else f"# loopd benchmarks, {date}\n"
    path.write_text(before.rstrip("\n") + "\n\n" + "\n".join(section(runs, date)) + "\n")
    log.info("placement section appended to %s", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
