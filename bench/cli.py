"""``python -m bench``: run every benchmark and write the report (what ``make bench`` does).

Order: the micro-benchmarks first (they need no server and are the most sensitive to load), then
the real llama-server is started once, on a Unix socket, with its three presets, for the cache
(both thinking templates) and switching benchmarks. The report goes to
``bench/results/<date>.md`` with a plot per template beside it.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from dataclasses import replace
from datetime import datetime
from pathlib import Path

import anyio

from bench import cache_reuse, overhead, parsers, switching
from bench.errors import BenchError
from bench.machine import describe, load_average
from bench.plot import prompt_n_plot
from bench.report import Results, render
from bench.sse_reference import REFERENCE_LIBRARY, library_parser, reference_parser
from loopd_dev import devserver

log = logging.getLogger("bench")

RESULTS = Path(__file__).resolve().parent / "results"
# Twice the default context: the naive client's last prompts of the session run past 4k tokens.
# Three presets at once: the plain one (thread switching) and the two thinking templates (cache).
LAYOUT = devserver.ServerLayout(ctx_size=16384, models_max=3)
CACHE_PRESETS = (devserver.THINKING_MODEL, devserver.EVERY_TURN_MODEL)


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
    args = parser.parse_args(argv)
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
    load_before = load_average()
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
    )
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    if not args.offline:
        results = _with_server(results, args)
    results = _finished(results, clock)
    path = out / f"{results.date}.md"
    path.write_text(render(results), encoding="utf-8")
    return path


def _with_server(results: Results, args: argparse.Namespace) -> Results:
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        work = Path(tmp)
        log.info("starting llama-server (build %d)", devserver.LLAMA_BUILD)
        server = devserver.start(
            work / "server",
            args.cache_dir,
            socket_path=work / "llama.sock",
            load=(devserver.PLAIN_MODEL, *CACHE_PRESETS),
            layout=LAYOUT,
        )
        try:
            caches, samples = anyio.run(_server_benchmarks, server.url, work)
        finally:
            server.stop()
    plot_files = []
    for cache in caches:
        plot_file = f"{results.date}-prompt-n-{cache.settings.model}.png"
        prompt_n_plot(cache.rows, args.out / plot_file, cache.settings.model)
        plot_files.append(plot_file)
    cpu = [
        overhead.cpu_share(
            "plain preset, whole turns (switching benchmark)",
            [s.cpu_s for s in samples],
            [s.wall_s for s in samples],
        ),
        overhead.cpu_share(
            "thinking presets, the model's answers (cache benchmark)",
            [s.cpu_s for cache in caches for s in cache.loopd_model_steps],
            [s.wall_s for cache in caches for s in cache.loopd_model_steps],
            [s.predicted_n for cache in caches for s in cache.loopd_model_steps],
        ),
    ]
    server_text = (
        f"llama.cpp build {devserver.LLAMA_BUILD} `llama-server` in router mode on a Unix "
        f"socket, {devserver.MODEL_FILE} on the CPU, presets `{devserver.PLAIN_MODEL}`, "
        f"`{devserver.THINKING_MODEL}` and `{devserver.EVERY_TURN_MODEL}`, "
        f"{LAYOUT.parallel} slots of {LAYOUT.ctx_size // LAYOUT.parallel:,} tokens each, "
        f"host prompt cache {LAYOUT.cache_ram_mib} MiB, {LAYOUT.threads} threads"
    )
    return replace(
        results,
        server=server_text,
        caches=caches,
        switching=switching.summarize(samples),
        cpu=cpu,
        plot_files=plot_files,
    )


async def _server_benchmarks(
    url: str, work: Path
) -> tuple[list[cache_reuse.CacheResult], list[switching.TurnSample]]:
    caches = []
    for model in CACHE_PRESETS:
        log.info("cache reuse on %s: the scripted session through loopd, then naive", model)
        settings = cache_reuse.SessionSettings(model=model)
        caches.append(await cache_reuse.run(url, work / f"cache-{model}", settings))
    log.info("thread switching")
    samples = await switching.run(url, work / "switching")
    return caches, samples


def _finished(results: Results, clock: float) -> Results:
    return replace(results, load_after=load_average(), duration_s=time.monotonic() - clock)


if __name__ == "__main__":
    sys.exit(main())
