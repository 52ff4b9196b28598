"""``python -m bench``: run every benchmark and write the report (what ``make bench`` does).

Order: the micro-benchmarks first (they need no server and are the most sensitive to load), then
the real llama-server is started once, on a Unix socket, with four presets, for the cache (both
SmolLM2 thinking templates and the hybrid preset) and switching (the plain and the hybrid
preset) benchmarks, logging at trace level so the hybrid's turns say what the server did. Then
benchmarks with routers of their own: pinning on a unified pool (``bench/pool.py``), where a
hybrid model's cache goes (``bench/hybrid.py``), placement across two endpoints
(``bench/placement.py``), real tool calls by the tool model (``bench/realtools.py``; alone:
``--real-tools``, written to ``<date>-real-tools.md``), the agent bench, a dozen small tasks
through ``loopd run`` on the agent model with the same turns' cache figures (``bench/agent.py``;
alone: ``--agent``), thinking loops ended early by the repetition watch on the tiny thinking
preset (``bench/thinkloops.py``; alone: ``--think-loops``) and durable sessions, a returning
session's re-read after the server forgot it, with and without a saved slot state (the server's
own save and restore, ``bench/durable.py``, then loopd's rule, ``bench/durable_loopd.py``,
when a save pays, ``bench/durable_rule.py``, twenty threads taking turns beyond the host cache,
``bench/durable_turns.py``, and the save folder under brokerd's cap, ``bench/durable_cap.py``;
alone: ``--durable``, written to
``<date>-durable.md``), and the edges, which need no real server: a command's start-up, brokerd's
relay of a streamed answer and the wait a person saw (``bench/edges.py``; alone: ``--edges``,
written to ``<date>-edges.md``). The report goes to ``bench/results/<date>.md`` with a plot per
template beside it; ``--append`` adds it below the day's earlier report instead of replacing it.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from pathlib import Path

import anyio

from bench import (
    agent,
    cache_reuse,
    durable,
    durable_cap,
    durable_loopd,
    durable_rule,
    durable_turns,
    edges,
    hybrid,
    overhead,
    parsers,
    placement,
    pool,
    realtools,
    scale,
    switching,
    thinkloops,
)
from bench.errors import BenchError
from bench.machine import describe, load_average
from bench.plot import prompt_n_plot
from bench.report import COMMAND, Results, cache_sections, render
from bench.serverlog import LogFollower
from bench.sse_reference import REFERENCE_LIBRARY, library_parser, reference_parser
from loopd_dev import devserver

log = logging.getLogger("bench")

RESULTS = Path(__file__).resolve().parent / "results"
# Twice the default context: the naive client's last prompts of the session run past 4k tokens.
# Four presets at once: the plain one (thread switching), the two thinking templates (cache) and
# the hybrid one (both).
LAYOUT = devserver.ServerLayout(ctx_size=16384, models_max=4)
CACHE_PRESETS = (devserver.THINKING_MODEL, devserver.EVERY_TURN_MODEL, devserver.HYBRID_MODEL)
SWITCHING_PRESETS = (devserver.PLAIN_MODEL, devserver.HYBRID_MODEL)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for the report")
    parser.add_argument("--repeats", type=int, default=5, help="runs of each micro-benchmark")
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=devserver.default_cache_dir(),
        help="where `make llama-server` put the server and the model",
    )
    parser.add_argument(
        "--offline", action="store_true", help="only the benchmarks that need no server"
    )
    parser.add_argument(
        "--production-shape",
        action="store_true",
        help="of the server benchmarks, only those about production's shape: the hybrid "
        "preset's cache reuse and switching, pinning on a unified pool, the hybrid model's losses",
    )
    parser.add_argument(
        "--scale-only",
        action="store_true",
        help="only the scale section (loopd's own cost as a thread's log grows; no server)",
    )
    parser.add_argument(
        "--real-tools",
        action="store_true",
        help="only the real tool calls of the tool model (cache reuse and the repeat guard), "
        "written to <date>-real-tools.md",
    )
    parser.add_argument(
        "--agent",
        action="store_true",
        help="only the agent bench (a dozen small tasks through `loopd run` on the agent "
        "model, with the same turns' cache figures), written to <date>-agent.md",
    )
    parser.add_argument(
        "--think-loops",
        action="store_true",
        help="only the thinking loops ended early (the repetition watch on the tiny thinking "
        "preset, with and without), written to <date>-think-loops.md",
    )
    parser.add_argument(
        "--durable",
        action="store_true",
        help="only durable sessions (returning after a server restart or a model reload, with "
        "and without a saved slot state), written to <date>-durable.md",
    )
    parser.add_argument(
        "--cache-reuse",
        action="store_true",
        help="only cache reuse against the naive client (all its mistakes and each alone), "
        "written to <date>-cache-reuse.md",
    )
    parser.add_argument(
        "--edges",
        action="store_true",
        help="only the edges: a command's start-up, brokerd's relay and the wait people see "
        "(no server), beside the recorded run before them, written to <date>-edges.md",
    )
    parser.add_argument(
        "--relay-before",
        type=Path,
        help="with the edges: this checkout's brokerd is measured too, in the same run (the tree "
        "before a change to brokerd)",
    )
    parser.add_argument(
        "--append",
        action="store_true",
        help="add the report below the day's earlier one instead of replacing it",
    )
    args = parser.parse_args(argv)
    given = sys.argv[1:] if argv is None else argv
    args.command = " ".join(["python -m bench", *given]) if given else COMMAND
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("loopd").setLevel(logging.WARNING)
    args = parse_args(argv)
    try:
        path = run(args)
    except (BenchError, devserver.DevServerError) as exc:
        sys.stderr.write(f"bench failed: {exc}\n")
        return 2
    log.info("report written to %s", path)
    return 0


def run(args: argparse.Namespace) -> Path:
    started, clock = datetime.now(), time.monotonic()
    if args.real_tools:
        return _section_only(args, started, "real tool calls", "real-tools", _real_tools)
    if args.durable:
        return _section_only(args, started, "durable sessions", "durable", _durable)
    if args.agent:
        return _section_only(args, started, "the agent bench", "agent", _agent)
    if args.think_loops:
        return _section_only(args, started, "thinking loops", "think-loops", _think_loops)
    if args.cache_reuse:
        return _section_only(args, started, "cache reuse", "cache-reuse", _cache_reuse)
    if args.edges:
        return _section_only(args, started, "the edges", "edges", _edges)
    load_before = load_average()
    if args.scale_only:
        return _scale_only(args, started)
    if library_parser() is None:
        log.info("%s is not installed: comparing with a line-by-line parser", REFERENCE_LIBRARY)
    reference = reference_parser()
    log.info("stream parsers (%d runs)", args.repeats)
    parser_rows = parsers.measure(reference, parsers.load_streams(), repeats=args.repeats)
    log.info("session log (%d runs)", args.repeats)
    log_cost = overhead.log_cost(args.repeats)
    log.info("memory with idle sessions (%d runs)", args.repeats)
    memory = overhead.memory(args.repeats)
    results = Results(
        date=started.strftime("%Y-%m-%d"),
        started=started.strftime("%Y-%m-%d %H:%M:%S"),
        duration_s=0.0,
        machine=describe(),
        load_before=load_before,
        load_after="",
        repeats=args.repeats,
        reference_parser=reference.name,
        parsers=parser_rows,
        log=log_cost,
        memory=memory,
        command=args.command,
        # A second report of the day is told apart by its start time, its plots by their names.
        title=started.strftime("%Y-%m-%d %H:%M") if args.append else "",
    )
    log.info("scale: sessions of %s entries", ", ".join(map(str, scale.SIZES)))
    results = replace(
        results, scale=scale.render(scale.measure(command=args.command), scale.before())
    )
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    if not args.offline:
        results = _with_server(results, args)
    section = "\n" + _edges(args)
    if not (args.offline or args.production_shape):
        parts = [_real_tools(args), _agent(args), _think_loops(args), _durable(args)]
        section += "\n" + "\n".join(parts)
    results = _finished(results, clock)
    path = out / f"{results.date}.md"
    write_report(path, render(results) + section, append=args.append)
    return path


def _edges(args: argparse.Namespace) -> str:
    log.info("the edges: start-up, relay, the wait people see")
    found = edges.measure(
        args.cache_dir, args.repeats, command=args.command, relay_before=args.relay_before
    )
    return "\n".join(edges.render(found, edges.before())) + "\n"


def _real_tools(args: argparse.Namespace) -> str:
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        return realtools.render(realtools.run(Path(tmp), args.cache_dir))


def _agent(args: argparse.Namespace) -> str:
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        return agent.render(agent.run(Path(tmp), args.cache_dir))


def _think_loops(args: argparse.Namespace) -> str:
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        return thinkloops.render(thinkloops.run(Path(tmp), args.cache_dir))


def _cache_reuse(args: argparse.Namespace) -> str:
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        work = Path(tmp)
        server = devserver.start(
            work / "server",
            args.cache_dir,
            socket_path=work / "llama.sock",
            load=CACHE_PRESETS,
            layout=LAYOUT,
        )
        try:
            caches, _ = anyio.run(
                _server_benchmarks,
                server.url,
                work,
                LogFollower(server.log_path),
                CACHE_PRESETS,
                (),
            )
        finally:
            server.stop()
    stem = f"{datetime.now():%Y-%m-%d}-cache-reuse"
    plot_files = []
    for cache in caches:
        plot_file = f"{stem}-prompt-n-{cache.settings.model}.png"
        prompt_n_plot(cache.rows, args.out / plot_file, cache.settings.model)
        plot_files.append(plot_file)
    return "\n".join(cache_sections(caches, plot_files)) + "\n"


def _durable(args: argparse.Namespace) -> str:
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        server = durable.render(durable.run(Path(tmp) / "server", args.cache_dir))
        through_loopd = durable_loopd.render(durable_loopd.run(Path(tmp) / "loopd", args.cache_dir))
        rule = durable_rule.render(durable_rule.run(Path(tmp) / "rule", args.cache_dir))
        many = durable_turns.render(durable_turns.run(Path(tmp) / "turns", args.cache_dir))
        capped = durable_cap.render(durable_cap.run(Path(tmp) / "cap", args.cache_dir))
        return "\n".join((server, through_loopd, rule, many, capped))


def _section_only(
    args: argparse.Namespace,
    started: datetime,
    title: str,
    stem: str,
    section_of: Callable[[argparse.Namespace], str],
) -> Path:
    """One section alone, in ``<date>-<stem>.md``."""
    head = f"# loopd benchmark, {title}: {started:%Y-%m-%d %H:%M}\n\n"
    machine = describe()
    head += (
        f"Command: `{args.command}`; machine: {machine.cpu_model}, {machine.cores} cores, "
        f"load average {load_average()} at the start.\n\n"
    )
    section = section_of(args)
    path = Path(args.out) / f"{started:%Y-%m-%d}-{stem}.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_report(path, head + section, append=args.append)
    return path


def _scale_only(args: argparse.Namespace, started: datetime) -> Path:
    """The scale section alone, beside the recorded run of the code before it (``scale``)."""
    log.info("scale: sessions of %s entries", ", ".join(map(str, scale.SIZES)))
    lines = scale.render(scale.measure(command=args.command), scale.before())
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{started.strftime('%Y-%m-%d')}-scale.md"
    write_report(path, "\n".join(["# loopd benchmarks, scale", "", *lines, ""]), append=args.append)
    return path


def write_report(path: Path, text: str, *, append: bool) -> None:
    """The report in ``path``; with ``append``, below what the file already holds."""
    if append and path.exists():
        text = path.read_text(encoding="utf-8").rstrip("\n") + "\n\n" + text
    path.write_text(text, encoding="utf-8")


def _with_server(results: Results, args: argparse.Namespace) -> Results:
    shape_only = args.production_shape
    cache_presets = (devserver.HYBRID_MODEL,) if shape_only else CACHE_PRESETS
    switching_presets = (devserver.HYBRID_MODEL,) if shape_only else SWITCHING_PRESETS
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        work = Path(tmp)
        log.info("starting llama-server (build %d)", devserver.LLAMA_BUILD)
        server = devserver.start(
            work / "server",
            args.cache_dir,
            socket_path=work / "llama.sock",
            load=tuple(dict.fromkeys((*switching_presets, *cache_presets))),
            layout=LAYOUT,
            extra_args=("-lv", "4"),
        )
        try:
            caches, samples = anyio.run(
                _server_benchmarks,
                server.url,
                work,
                LogFollower(server.log_path),
                cache_presets,
                switching_presets,
            )
        finally:
            server.stop()
        log.info("pinning on a unified pool (a router of its own)")
        pool_layouts, pool_requests = pool.run(work / "pool", args.cache_dir)
        log.info("where a hybrid model's cache goes (a router of its own)")
        hybrid_rows = hybrid.run(work / "hybrid", args.cache_dir)
        placement_runs = None
        if not shape_only:
            log.info("placement across endpoints (two routers of their own)")
            placement_runs = placement.run(work / "placement", args.cache_dir)
    plot_files = []
    stem = results.started.replace(":", "")[:15].replace(" ", "-") if args.append else results.date
    for cache in caches:
        plot_file = f"{stem}-prompt-n-{cache.settings.model}.png"
        prompt_n_plot(cache.rows, args.out / plot_file, cache.settings.model)
        plot_files.append(plot_file)
    plain = [s for s in samples if s.model == devserver.PLAIN_MODEL]
    thinking = [
        s for c in caches if c.settings.model != devserver.HYBRID_MODEL for s in c.loopd_model_steps
    ]
    cpu = []
    if plain:
        cpu.append(
            overhead.cpu_share(
                "plain preset, whole turns (switching benchmark)",
                [s.cpu_s for s in plain],
                [s.wall_s for s in plain],
            )
        )
    if thinking:
        cpu.append(
            overhead.cpu_share(
                "thinking presets, the model's answers (cache benchmark)",
                [s.cpu_s for s in thinking],
                [s.wall_s for s in thinking],
                [s.predicted_n for s in thinking],
            )
        )
    hybrid_layout = devserver.SlotLayout()
    smollm2 = (
        f"{devserver.MODEL_FILE} as presets `{devserver.PLAIN_MODEL}`, "
        f"`{devserver.THINKING_MODEL}` and `{devserver.EVERY_TURN_MODEL}`, {LAYOUT.parallel} "
        f"slots of {LAYOUT.ctx_size // LAYOUT.parallel:,} tokens each; "
    )
    server_text = (
        f"llama.cpp build {devserver.LLAMA_BUILD} `llama-server` in router mode on a Unix "
        f"socket (trace log, `-lv 4`), on the CPU: {'' if shape_only else smollm2}"
        f"{devserver.HYBRID_MODEL_FILE} as `{devserver.HYBRID_MODEL}`, "
        f"{hybrid_layout.parallel} slots on one unified {hybrid_layout.ctx_size:,}-token pool; "
        f"host prompt cache {LAYOUT.cache_ram_mib} MiB, {LAYOUT.threads} threads"
        + (" (`--production-shape`: only the production shape's benchmarks)" if shape_only else "")
    )
    return replace(
        results,
        server=server_text,
        caches=caches,
        switching=switching.summarize(samples),
        switching_turns=[s for s in samples if s.model == devserver.HYBRID_MODEL],
        cpu=cpu,
        plot_files=plot_files,
        pool_layouts=pool_layouts,
        pool=pool_requests,
        hybrid=hybrid_rows,
        placement=placement_runs,
    )


async def _server_benchmarks(
    url: str,
    work: Path,
    server_log: LogFollower,
    cache_presets: tuple[str, ...] = CACHE_PRESETS,
    switching_presets: tuple[str, ...] = SWITCHING_PRESETS,
) -> tuple[list[cache_reuse.CacheResult], list[switching.TurnSample]]:
    caches = []
    for model in cache_presets:
        log.info("cache reuse on %s: the scripted session through loopd, then naive", model)
        settings = cache_reuse.SessionSettings(model=model)
        caches.append(await cache_reuse.run(url, work / f"cache-{model}", settings))
    samples = []
    for model in switching_presets:
        log.info("thread switching on %s", model)
        hybrid_preset = model == devserver.HYBRID_MODEL
        samples += await switching.run(
            url,
            work / f"switching-{model}",
            model=model,
            server_log=server_log if hybrid_preset else None,
            hybrid=hybrid_preset,
        )
    return caches, samples


def _finished(results: Results, clock: float) -> Results:
    return replace(results, load_after=load_average(), duration_s=time.monotonic() - clock)


if __name__ == "__main__":
    sys.exit(main())
